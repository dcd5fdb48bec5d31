"use strict";
// What both pages share: the secret for changes, JSON fetches, times and durations in words.
const TOKEN = document.querySelector('meta[name="launcher-token"]').content;

async function getJson(url, signal) {
  const answer = await fetch(url, {credentials: "same-origin", signal});
  const body = await answer.json().catch(() => ({error: answer.statusText}));
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

async function postJson(url, question, signal) {
  const headers = {"X-Launcher-Token": TOKEN};
  if (question !== undefined) headers["Content-Type"] = "application/json";
  const answer = await fetch(url, {method: "POST", credentials: "same-origin", headers, signal,
                                   body: question === undefined ? undefined : JSON.stringify(question)});
  const body = await answer.json().catch(() => ({error: answer.statusText}));
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "-";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || seconds < 0) return "-";
  const s = Math.round(seconds);
  if (s < 120) return s + "s";
  if (s < 7200) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (className) td.className = className;
  return td;
}

function showProblem(error) {
  const problem = document.getElementById("problem");
  problem.hidden = !error;
  problem.textContent = error ? String(error.message || error) : "";
}
