"use strict";
// One run: its state every few seconds; its merged log after a cursor, at most MAX_LINES kept (oldest dropped).
const RUN_ID = decodeURIComponent(location.pathname.split("/").pop());
const API = "/api/runs/" + encodeURIComponent(RUN_ID);
const STATE_MS = 2000;
const LOG_MS = 1000;
const TIMELINE_MS = 15000;
const MAX_LINES = 5000;
const FOLDED_NODES = 25;  // a run of more nodes shows this many rows, those in trouble first, until asked for all
const TROUBLE = ["failed", "failed to start", "lost", "cancelled"];  // the states its rows are shown first for
const logBox = document.getElementById("log");
let ended = false;
let after = null;        // the server's cursor: where each node's log stands for this page
let logFailures = 0;     // questions for the log that failed in a row
let generation = 0;      // a new rank filter starts the log again; answers to older questions are dropped
let older = false;       // the log has older lines than those shown (the page dropped them, or was never sent them)
let lastDone = false;    // the ended run's log was read to its end
let asking = null;       // the log question in flight: a new rank filter aborts it rather than wait for its answer
let unfolded = false;    // every node's row is shown, however many
let lastRun = null;      // the run as last read: unfolding draws it again at once
let drawing = false;     // a timeline picture is on its way
let drawnStates = null;  // the run's result and node states the picture shown was drawn at, and when
let drawnAt = 0;
const ranks = new Set();

async function showRun() {
  try {
    const run = await getJson(API);
    document.title = "launcher: " + run.run_id;
    document.getElementById("run-id").textContent = run.run_id;
    const state = document.getElementById("state");
    state.textContent = run.result;
    state.className = "state " + run.result.replace(/ /g, "-");
    document.getElementById("facts").textContent =
      `${run.name || "(no name)"} on ${run.backend}, ${run.nodes.length} node${run.nodes.length === 1 ? "" : "s"}; ` +
      `started ${when(run.created_at)}; work dir ${run.work_dir}`;
    const engine = document.getElementById("engine");
    engine.hidden = !run.engine;
    engine.textContent = run.engine;
    const summary = document.getElementById("summary");
    summary.hidden = !run.summary;
    summary.textContent = run.summary;
    summary.className = run.result.replace(/ /g, "-");
    const costs = document.getElementById("costs");
    costs.hidden = !run.costs;
    costs.textContent = run.costs;
    document.getElementById("incidents").replaceChildren(
      ...run.incidents.map((line) => Object.assign(document.createElement("li"), {textContent: line})));
    document.getElementById("cancel").hidden = run.ended;
    lastRun = run;
    showNodes(run.nodes);
    showHealth(run.health, run.stragglers);
    showTimeline(run);
    showProblem(null);
    ended = run.ended;
  } catch (error) {
    showProblem(error);
  }
  if (!ended) setTimeout(showRun, STATE_MS);
}

function showNodes(nodes) {
  // a row per node, those in trouble first; of many nodes, the first FOLDED_NODES rows and a count per state
  const trouble = (node) => (TROUBLE.includes(node.state) ? 0 : 1);
  const ordered = nodes.map((node, index) => [trouble(node), index, node]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const shown = unfolded ? ordered : ordered.slice(0, FOLDED_NODES);
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const [, , node] of shown) {
    const row = body.insertRow();
    row.dataset.node = node.name;
    cell(row, node.name);
    cell(row, node.rank);
    cell(row, node.state, "state " + String(node.state).replace(/ /g, "-"));
    cell(row, node.exit_code);
    cell(row, node.address);
    cell(row, when(node.updated_at));
    cell(row, node.reason, "reason");
  }
  const counts = new Map();
  for (const node of nodes) counts.set(node.state, (counts.get(node.state) || 0) + 1);
  document.getElementById("node-counts").textContent =
    [...counts].map(([state, count]) => `${count.toLocaleString("en")} ${state}`).join(", ");
  const fold = document.getElementById("fold-nodes");
  fold.hidden = nodes.length <= FOLDED_NODES;
  fold.textContent = unfolded ? `show the first ${FOLDED_NODES}` : `show all ${nodes.length} nodes`;
}

function showHealth(table, stragglers) {
  // launcher top's table: a row per node, then one per rank of it
  const shown = document.getElementById("health");
  shown.hidden = table.length === 0;
  const none = document.getElementById("no-health");
  none.hidden = table.length > 0;
  if (lastRun && lastRun.ended) none.textContent = "its nodes recorded no figures";
  const head = shown.tHead;
  head.replaceChildren();
  if (table.length) {
    const row = head.insertRow();
    for (const name of table[0]) row.append(Object.assign(document.createElement("th"), {textContent: name}));
  }
  const body = shown.tBodies[0];
  body.replaceChildren();
  let nodes = 0;
  for (const cells of table.slice(1)) {
    nodes += cells[0].startsWith(" ") ? 0 : 1;
    if (nodes > FOLDED_NODES && !unfolded) break;  // as the nodes' table: the rest once asked for
    const row = body.insertRow();
    row.className = cells[0].startsWith(" ") ? "rank" : "node";
    for (const text of cells) cell(row, text.trim());
  }
  const list = document.getElementById("stragglers");
  list.replaceChildren(...stragglers.map((line) => Object.assign(document.createElement("li"), {textContent: line})));
}

function showTimeline(run) {
  // drawn again when a state changed, else at most every TIMELINE_MS (the server reads every node's events for it:
  // at 1,024 nodes about 3 s of its time), one drawing at a time
  const states = run.result + "|" + run.nodes.map((node) => node.state).join(",");
  if (drawing || (states === drawnStates && Date.now() - drawnAt < TIMELINE_MS)) return;
  drawing = true;
  const picture = document.getElementById("timeline");
  const fresh = new Image();
  fresh.onload = () => {
    picture.src = fresh.src;
    picture.hidden = false;
    document.getElementById("no-timeline").hidden = true;
    [drawnStates, drawnAt, drawing] = [states, Date.now(), false];
  };
  fresh.onerror = () => {
    drawing = false;
  };
  fresh.src = API + "/timeline.svg?at=" + Date.now();
}

function addLines(lines) {
  const follow = document.getElementById("follow").checked;
  const fragment = document.createDocumentFragment();
  for (const line of lines) {
    const row = document.createElement("div");
    row.className = "line";
    row.dataset.node = line.node;
    row.dataset.who = line.who;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = line.who.startsWith("[") ? `[${line.node}] ${line.who}` : `[${line.node} r${line.who}]`;
    row.append(who, " ", line.text);
    fragment.append(row);
    if (!line.who.startsWith("[") && !ranks.has(line.who)) addRank(line.who);
  }
  logBox.append(fragment);
  while (logBox.childElementCount > MAX_LINES) {
    logBox.firstElementChild.remove();
    older = true;
  }
  document.getElementById("log-count").textContent =
    `${logBox.childElementCount} lines` + (older ? " (the newest; older ones are not shown)" : "");
  if (follow && lines.length) logBox.scrollTop = logBox.scrollHeight;
}

function addRank(rank) {
  ranks.add(rank);
  const option = document.createElement("option");
  option.value = option.textContent = rank;
  const select = document.getElementById("rank");
  const later = [...select.options].find((o) => /^\d+$/.test(o.value) && Number(o.value) > Number(rank));
  select.insertBefore(option, later || null);
}

async function pollLog() {
  const asked = generation;
  const wasEnded = ended;
  // in a body, not the address: the cursor names every node of the run, more than an address holds in large runs
  const question = {limit: MAX_LINES, final: wasEnded ? "1" : "0", rank: document.getElementById("rank").value,
                    after};
  asking = new AbortController();
  let wait = LOG_MS;
  try {
    const found = await postJson(API + "/log", question, asking.signal);
    if (asked === generation) {  // else the filter changed meanwhile: this answer is for the old one
      after = found.after;
      older = older || found.older;
      addLines(found.lines);
      if (wasEnded) lastDone = true;
    }
    logFailures = 0;
  } catch (error) {
    if (error.name !== "AbortError") {
      showProblem(error);
      logFailures += 1;  // asked again, less often each time (at most every 30 s), not every second forever
      wait = Math.min(30000, LOG_MS * 2 ** logFailures);
    }
  }
  if (!lastDone) setTimeout(pollLog, asked === generation ? wait : 0);
}

document.getElementById("rank").addEventListener("change", () => {
  generation += 1;
  after = null;
  older = false;
  logBox.replaceChildren();
  document.getElementById("log-count").textContent = "reading the log…";
  if (asking) asking.abort();
  if (lastDone) {
    lastDone = false;
    pollLog();
  }
});

document.getElementById("fold-nodes").addEventListener("click", () => {
  unfolded = !unfolded;
  if (lastRun) {
    showNodes(lastRun.nodes);
    showHealth(lastRun.health, lastRun.stragglers);
  }
});

document.getElementById("cancel").addEventListener("click", async () => {
  if (!confirm(`Cancel run ${RUN_ID}? Every node is stopped (forced after 15 s).`)) return;
  try {
    await postJson(API + "/cancel");
    document.getElementById("cancel").disabled = true;
    document.getElementById("cancel").textContent = "cancelling…";
  } catch (error) {
    showProblem(error);
  }
});

showRun();
pollLog();
