"use strict";
// The run list: filtered and paged by the server; read again every few seconds.
const REFRESH_MS = 5000;
const PER_PAGE = 50;
let page = 1;
let refreshing = null;
let asked = 0;  // the latest question: an answer to an older one (a search typed further since) is dropped

async function showRuns() {
  const mine = ++asked;
  const query = new URLSearchParams({
    q: document.getElementById("q").value, state: document.getElementById("state").value,
    backend: document.getElementById("backend").value, page: String(page), per_page: String(PER_PAGE)});
  try {
    const found = await getJson("/api/runs?" + query);
    if (mine !== asked) return;
    const body = document.querySelector("#runs tbody");
    body.replaceChildren();
    for (const run of found.runs) {
      const row = body.insertRow();
      row.dataset.run = run.run_id;
      const link = document.createElement("a");
      link.href = "/runs/" + encodeURIComponent(run.run_id);
      link.textContent = run.run_id;
      row.insertCell().append(link);
      cell(row, run.name);
      cell(row, run.backend);
      cell(row, run.nodes);
      cell(row, when(run.created_at));
      cell(row, duration((run.ended_at || Date.now() / 1000) - run.created_at));
      cell(row, run.state, "state " + run.state.replace(/ /g, "-"));
      cell(row, run.result, "result");
    }
    document.getElementById("where").textContent =
      `page ${found.page} of ${found.pages} (${found.total} run${found.total === 1 ? "" : "s"})`;
    document.getElementById("newer").disabled = found.page <= 1;
    document.getElementById("older").disabled = found.page >= found.pages;
    showProblem(null);
  } catch (error) {
    showProblem(error);
  }
  clearTimeout(refreshing);
  refreshing = setTimeout(showRuns, REFRESH_MS);
}

function fromStart() {
  page = 1;
  showRuns();
}

document.getElementById("filters").addEventListener("submit", (event) => { event.preventDefault(); fromStart(); });
document.getElementById("q").addEventListener("input", fromStart);
document.getElementById("state").addEventListener("change", fromStart);
document.getElementById("backend").addEventListener("change", fromStart);
document.getElementById("newer").addEventListener("click", () => { page -= 1; showRuns(); });
document.getElementById("older").addEventListener("click", () => { page += 1; showRuns(); });
showRuns();
