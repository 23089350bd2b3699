// diagsafe-local's review page: browse every judged answer, or label a sample of them.
// Every text from the run (prompts, answers, verdicts) is hostile: it is only ever set with textContent.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const state = { page: 0, size: 50, total: 0, meta: null, sample: null, position: 0, rowsRequest: 0 };

function api(path, options = {}) {
  const headers = Object.assign({ "X-Token": token }, options.headers || {});
  return fetch(path, Object.assign({}, options, { headers })).then(async (response) => {
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  });
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function badge(text, kind) {
  return el("span", text, "badge " + (kind || ""));
}

function fmtScore(score) {
  return score === null || score === undefined ? "no score" : Number(score).toFixed(2);
}

// -- browsing ------------------------------------------------------------------------------------------------

function fillFacets(facets) {
  const names = { target: "target", category: "category", source: "source", attack_method: "attack_method", verdict: "verdict", status: "status" };
  for (const [field, facet] of Object.entries(names)) {
    const select = document.querySelector(`#filters select[name=${field}]`);
    select.replaceChildren(el("option", "any"));
    select.firstChild.value = "";
    for (const value of facets[facet] || []) {
      const option = el("option", value);
      option.value = value;
      select.appendChild(option);
    }
  }
}

function query() {
  const form = new FormData(document.getElementById("filters"));
  const params = new URLSearchParams();
  for (const [key, value] of form.entries()) if (value !== "") params.set(key, value);
  params.set("page", state.page);
  params.set("size", state.size);
  return params;
}

async function loadRows() {
  // Typing fires one request per key and the server answers them in parallel: only the latest may be shown.
  const request = ++state.rowsRequest;
  const result = await api("/api/rows?" + query().toString());
  if (request !== state.rowsRequest) return;
  state.total = result.total;
  document.getElementById("count").textContent = `${result.total} of ${state.meta.total} answers`;
  const list = document.getElementById("rows");
  list.replaceChildren();
  for (const row of result.rows) {
    const item = el("li");
    item.tabIndex = 0;
    item.dataset.index = row.index;
    const meta = el("div", null, "meta");
    meta.append(badge(row.verdict, row.verdict), badge(fmtScore(row.score)));
    if (row.judged_by) meta.append(badge(row.judged_by, "judged-by"));
    if (row.screen_score !== null) meta.append(badge(`screen ${fmtScore(row.screen_score)}`, "screen"));
    if (row.flip) meta.append(badge("flip", "flip"));
    if (row.cut_off) meta.append(badge("cut off"));
    if (row.status !== "ok") meta.append(badge(row.status));
    meta.append(el("span", `${row.target} · ${row.item_id} · sample ${row.sample} · turn ${row.turn} · ${row.category}`));
    item.append(meta, el("div", row.request_head, "text head request"), el("div", row.answer_head, "text head answer-head"));
    item.addEventListener("click", () => openRow(row.index));
    item.addEventListener("keydown", (event) => { if (event.key === "Enter") openRow(row.index); });
    list.appendChild(item);
  }
  const pages = Math.max(1, Math.ceil(result.total / state.size));
  document.getElementById("pageinfo").textContent = `page ${state.page + 1} of ${pages}`;
  document.getElementById("prev").disabled = state.page === 0;
  document.getElementById("next").disabled = state.page + 1 >= pages;
}

function conversation(record) {
  const box = el("div");
  for (const message of record.conversation || []) {
    const turn = el("div", null, "turn " + message.role);
    turn.append(el("div", message.role, "meta"), el("div", message.content, "text"));
    box.appendChild(turn);
  }
  const answer = el("div", null, "answer");
  answer.append(el("div", "answer judged", "meta"), el("div", record.answer, "text answer-text"));
  box.appendChild(answer);
  return box;
}

// A cascade's answer sent up (`decided`): the full judge's verdict, the one the gate decides on (or that it has none
// yet: no score), then the screen's.
function verdict(record, decided) {
  const list = el("dl", null, "verdict");
  const add = (key, value) => { list.append(el("dt", key), el("dd", value, "text")); };
  if (decided && decided.judged_by !== "full judge") add("full judge", decided.judged_by);  // no verdict yet: no score
  else if (decided) {
    const vote = decided.vote;
    add("decided by", `full judge: ${fmtScore(decided.score)}` + (decided.gave_no_verdict ? " (it gave no verdict: counts harmful)" : ""));
    if (vote) {
      add("full judge", vote.rubric);
      add("full judge parse", vote.parse_status);
      for (const [key, value] of Object.entries(vote.verdict || {})) add(`full judge: ${key}`, typeof value === "string" ? value : JSON.stringify(value));
    }
  }
  add(decided ? "screen, not decided on" : "judge", record.judge_rubric);
  add("score", fmtScore(record.score));
  add("parse", record.parse_status + (record.error ? ` (${record.error})` : ""));
  for (const [key, value] of Object.entries(record.verdict || {})) add(key, typeof value === "string" ? value : JSON.stringify(value));
  if (record.reasoning && record.reasoning.text) add("reasoning", record.reasoning.text);
  for (const vote of record.panel || []) add(`panel: ${vote.rubric}`, `${fmtScore(vote.score)} ${vote.parse_status}`);
  return list;
}

function side(record, decided, title) {
  const box = el("div");
  box.append(el("h3", title), conversation(record), verdict(record, decided));
  return box;
}

async function openRow(index) {
  const result = await api(`/api/row/${index}`);
  const detail = document.getElementById("detail");
  detail.hidden = false;
  detail.replaceChildren();
  const close = el("button", "close");
  close.type = "button";
  close.addEventListener("click", () => { detail.hidden = true; });
  detail.append(close, el("h2", `${result.row.target} · item ${result.row.item_id}` + (result.row.flip ? " · flip" : "")));
  const sides = el("div", null, "sides");
  sides.append(side(result.record, result.decided, `${result.record.target} (${result.run_dir})`));
  for (const other of result.others) sides.append(side(other, other.decided, `${other.target} (run ${other.run + 1})`));
  detail.appendChild(sides);
  detail.scrollTop = 0;
}

function startBrowsing() {
  document.getElementById("browse").hidden = false;
  fillFacets(state.meta.facets);
  const form = document.getElementById("filters");
  form.addEventListener("change", () => { state.page = 0; loadRows(); });
  form.addEventListener("submit", (event) => { event.preventDefault(); state.page = 0; loadRows(); });
  form.querySelector("input[name=q]").addEventListener("input", () => { state.page = 0; loadRows(); });
  document.getElementById("prev").addEventListener("click", () => { state.page -= 1; loadRows(); });
  document.getElementById("next").addEventListener("click", () => { state.page += 1; loadRows(); });
  loadRows();
}

// -- labelling -----------------------------------------------------------------------------------------------

async function showEntry(position) {
  const count = state.sample.entries.length;
  state.position = Math.max(0, Math.min(position, count - 1));
  const entry = await api(`/api/sample/${state.position}`);
  const done = state.sample.entries.filter((e) => e.labelled).length;
  document.getElementById("progress").textContent = `answer ${state.position + 1} of ${count} · ${done} labelled`;
  const item = document.getElementById("item");
  item.replaceChildren(el("div", `${entry.target} · item ${entry.item_id} · ${entry.category}`, "meta"), conversation(entry));
  for (const button of document.querySelectorAll("#choice button")) {
    button.classList.toggle("chosen", button.dataset.label === entry.label);
  }
  const reveal = document.getElementById("reveal");
  reveal.replaceChildren();
  if (entry.label) reveal.append(el("h3", `your label: ${entry.label} · the judge said:`), verdict(entry, entry.decided));
}

// Under `label --next`: whether the decision is settled, after the labels given so far (null: not --next).
function showStanding(line) {
  const standing = document.getElementById("standing");
  standing.hidden = !line;
  standing.textContent = line || "";
  standing.classList.toggle("settled", Boolean(line && line.startsWith("SETTLED")));
}

async function give(label) {
  const entry = await api("/api/label", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ index: state.position, label }) });
  state.sample.entries[state.position].labelled = entry.label;
  showStanding(entry.standing);
  await showEntry(state.position + 1 < state.sample.entries.length ? state.position + 1 : state.position);
}

// Keys come faster than the server answers: each action starts when the one before has shown its result,
// so a label always goes to the answer on screen when its key was pressed.
let actions = Promise.resolve();
function act(action) {
  actions = actions.then(action).catch((error) => { document.getElementById("progress").textContent = `error: ${error.message}`; });
}

async function startLabelling() {
  document.getElementById("labelling").hidden = false;
  state.sample = await api("/api/sample");
  document.getElementById("subtitle").textContent = `labelling as ${state.sample.annotator}`;
  showStanding(state.sample.standing);
  for (const button of document.querySelectorAll("#choice button")) {
    button.addEventListener("click", () => act(() => give(button.dataset.label)));
  }
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement) return;
    const keys = { h: "harmful", n: "not_harmful", u: "unsure" };
    if (keys[event.key]) act(() => give(keys[event.key]));
    else if (event.key === "ArrowRight" || event.key === "j") act(() => showEntry(state.position + 1));
    else if (event.key === "ArrowLeft" || event.key === "k") act(() => showEntry(state.position - 1));
  });
  await showEntry(Math.min(state.sample.next, state.sample.entries.length - 1));
}

async function start() {
  state.meta = await api("/api/meta");
  const runs = state.meta.runs.map((r) => r.dir).join(" · ");
  document.getElementById("subtitle").textContent = runs;
  const notes = document.getElementById("notes");  // the files shown in part (a killed run's), and why
  notes.replaceChildren(...state.meta.notes.map((note) => el("p", note)));
  notes.hidden = state.meta.notes.length === 0;
  if (state.meta.mode === "label") await startLabelling();
  else startBrowsing();
}

document.addEventListener("DOMContentLoaded", () => {
  start().catch((error) => { document.body.appendChild(el("p", `error: ${error.message}`)); });
});
