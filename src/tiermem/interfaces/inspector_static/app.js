// tiermem inspector: plain JS, no dependencies. Every data request carries the API key
// (kept in sessionStorage only) as a Bearer header; text is always inserted as text.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { user: "", session: null };
const COLORS = {
  system: "#5b6b8c", tools: "#7d5ba6", profile: "#2e7d6b", summary: "#3c8d2f",
  structured_memory: "#6a9a1f", entities: "#b07b12", recall: "#c2571a", turn: "#1a56c4",
  current: "#b3261e",
};

function setStatus(text) { $("status").textContent = text; }

async function api(path) {
  const headers = {};
  const key = $("key").value.trim();
  if (key) headers.Authorization = "Bearer " + key;
  const response = await fetch("api/" + path, { headers });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error(`${response.status}: ${body.message || body.detail || response.statusText}`);
  }
  return body;
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fill(tableId, rows, render) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const item of rows) {
    const tr = document.createElement("tr");
    render(tr, item);
    body.appendChild(tr);
  }
}

function when(iso) { return iso ? iso.replace("T", " ").slice(0, 19) : ""; }

async function loadUser(event) {
  if (event) event.preventDefault();
  state.user = $("user").value.trim();
  sessionStorage.setItem("tiermem.key", $("key").value);
  sessionStorage.setItem("tiermem.user", state.user);
  try {
    const [sessions, memories] = await Promise.all([
      api(`users/${encodeURIComponent(state.user)}/sessions`),
      api(`users/${encodeURIComponent(state.user)}/memories`),
    ]);
    const list = $("session-list");
    list.replaceChildren();
    for (const s of sessions.sessions) {
      const li = document.createElement("li");
      li.dataset.session = s.session_id;
      li.textContent = s.session_id;
      const small = document.createElement("small");
      small.textContent = `${s.turns} turns · ${when(s.created_at)}${s.live ? "" : " · expired"}`;
      li.appendChild(small);
      li.addEventListener("click", () => loadSession(s.session_id));
      list.appendChild(li);
    }
    renderMemories(memories.memories);
    setStatus(`${sessions.sessions.length} sessions, ${memories.memories.length} memories`);
  } catch (error) {
    setStatus(error.message);
  }
}

function provenanceLink(td, sessionId, turns) {
  if (!sessionId) return;
  const a = document.createElement("a");
  a.className = "prov";
  a.textContent = turns.length ? `${sessionId} #${turns.join(",")}` : sessionId;
  a.addEventListener("click", () => loadSession(sessionId, turns[0]));
  td.appendChild(a);
}

function renderMemories(memories) {
  fill("memories", memories, (tr, m) => {
    cell(tr, m.memory_type);
    cell(tr, m.content);
    provenanceLink(cell(tr, ""), m.provenance.session_id, m.provenance.turn_indexes);
  });
}

async function loadSession(sessionId, focusTurn) {
  try {
    const s = await api(`sessions/${encodeURIComponent(sessionId)}`);
    state.session = sessionId;
    for (const li of $("session-list").children) {
      li.classList.toggle("active", li.dataset.session === sessionId);
    }
    $("session").hidden = false;
    $("session-title").textContent =
      `${sessionId} — ${s.metadata.turn_count} turns, served from ${s.served_from}`;
    const turns = [
      ...s.archived_turns.map((t) => ({ ...t, tier: "archived" })),
      ...s.hot_turns.map((t) => ({ ...t, tier: "hot" })),
    ];
    fill("turns", turns, (tr, t) => {
      tr.className = t.tier;
      tr.id = `turn-${t.index}`;
      cell(tr, t.index, "num");
      cell(tr, t.tier);
      cell(tr, t.role);
      cell(tr, when(t.timestamp), "time");
      cell(tr, t.tokens, "num");
      cell(tr, t.importance.toFixed(2), "num");
      const text = document.createElement("div");
      text.className = "clip"; // a large tool output scrolls inside its row
      text.textContent = t.text;
      cell(tr, "").appendChild(text);
    });
    fill("entities", s.entities, (tr, e) => { cell(tr, e.kind); cell(tr, e.value); cell(tr, e.turn_index); });
    fill("state", s.state, (tr, b) => { cell(tr, b.name); cell(tr, b.version); cell(tr, JSON.stringify(b.data)); });
    fill("records", s.records, (tr, r) => {
      cell(tr, r.kind); cell(tr, r.version); cell(tr, r.bytes, "num");
      const pre = document.createElement("pre");
      pre.textContent = r.data ? JSON.stringify(r.data, null, 1) : "";
      cell(tr, "").appendChild(pre);
    });
    fill("stats", Object.entries(s.stats), (tr, [k, v]) => { cell(tr, k); cell(tr, v); });
    renderSummaries(s.summaries);
    renderStructured(s.structured);
    await loadTools();
    showTab("turns");
    if (focusTurn !== undefined) {
      const row = $(`turn-${focusTurn}`);
      if (row) { row.classList.add("flash"); row.scrollIntoView({ block: "center" }); }
    }
    await loadContext();
  } catch (error) {
    setStatus(error.message);
  }
}

function renderSummaries(summaries) {
  const w = summaries.watermarks;
  $("watermarks").textContent =
    `summarized through turn ${w.summarized_through}, structured memory through turn ` +
    `${w.extracted_through}, ${w.passes} passes; ${summaries.compression.keep_hot} newest turns kept raw`;
  fill("summaries", summaries.tiers, (tr, t) => {
    tr.className = `tier-${t.tier}`;
    cell(tr, t.tier);
    cell(tr, `${t.first_index}–${t.through_index}`);
    cell(tr, t.tokens, "num");
    cell(tr, t.engine);
    cell(tr, t.text);
  });
}

function renderStructured(memory) {
  const rows = [
    ...Object.values(memory.entities).map((f) => ["entity", f]),
    ...Object.values(memory.facts).map((f) => ["fact", f]),
  ];
  fill("structured", rows, (tr, [kind, f]) => {
    cell(tr, kind); cell(tr, f.slot); cell(tr, f.value); cell(tr, f.turn_index, "num");
    cell(tr, f.previous.join(", "), "old");
  });
  const body = $("structured").querySelector("tbody");
  for (const kind of ["decisions", "goals", "unresolved"]) {
    for (const item of memory[kind]) {
      const tr = document.createElement("tr");
      cell(tr, kind.replace(/s$/, "")); cell(tr, ""); cell(tr, item.text); cell(tr, item.turn_index, "num"); cell(tr, "");
      body.appendChild(tr);
    }
  }
}

async function loadTools() {
  const t = await api("tools");
  fill("tools", t.tools, (tr, tool) => {
    tr.className = `health-${tool.health}`;
    cell(tr, tool.name); cell(tr, tool.health); cell(tr, tool.breaker);
    cell(tr, tool.calls, "num"); cell(tr, tool.failures, "num"); cell(tr, tool.message || "");
  });
}

async function loadContext(event) {
  if (event) event.preventDefault();
  if (!state.session) return;
  const query = encodeURIComponent($("context-query").value);
  const budget = encodeURIComponent($("context-budget").value || "8000");
  try {
    const w = await api(`sessions/${encodeURIComponent(state.session)}/context?query=${query}&budget=${budget}`);
    fill("context", w.items, (tr, item) => {
      cell(tr, item.kind + (item.truncated ? " (cut)" : ""));
      cell(tr, item.role);
      cell(tr, item.tokens, "num");
      const p = item.provenance;
      const from = cell(tr, p.tier + " ");
      if (p.turn_indexes.length) from.append(`turns ${p.turn_indexes.join(",")}`);
      if (p.memory_ids.length) from.append(` memories ${p.memory_ids.length}`);
      cell(tr, item.text);
    });
    const chart = $("context-chart");
    chart.replaceChildren();
    // Token usage: the context bar splits the window's tokens by kind; both bars are drawn
    // to one scale, so the context's length against the full history's is the saving.
    const total = Math.max(1, w.stats.total_tokens);
    const scale = Math.max(total, w.history_tokens, 1);
    chart.style.width = `${(100 * total) / scale}%`;
    const history = $("history-chart");
    history.replaceChildren();
    history.style.width = `${(100 * Math.max(1, w.history_tokens)) / scale}%`;
    const all = document.createElement("span");
    all.style.width = "100%";
    all.textContent = `${w.history_tokens} tokens`;
    history.appendChild(all);
    for (const [kind, tokens] of Object.entries(w.stats.tokens_by_tier)) {
      if (!tokens) continue;
      const bar = document.createElement("span");
      bar.style.width = `${(100 * tokens) / total}%`;
      bar.style.background = COLORS[kind] || "#888";
      bar.title = `${kind}: ${tokens} tokens`;
      bar.textContent = `${kind} ${tokens}`;
      chart.appendChild(bar);
    }
    const saved = w.history_tokens ? 100 * (1 - w.stats.total_tokens / w.history_tokens) : 0;
    $("context-summary").textContent =
      `${w.stats.total_tokens} of ${w.stats.budget_tokens} tokens ` +
      `(${w.stats.context_window_percent.toFixed(1)}%), ${w.stats.total_turns} turns in the session, ` +
      `${w.stats.hot_turns} offered by the hot window; the full history is ` +
      `${w.history_tokens} tokens: ${saved.toFixed(0)}% saved`;
  } catch (error) {
    setStatus(error.message);
  }
}

async function recall(event) {
  event.preventDefault();
  const q = $("recall-query").value.trim();
  if (!q || !state.user) return;
  try {
    const r = await api(`users/${encodeURIComponent(state.user)}/recall?q=${encodeURIComponent(q)}`);
    const list = $("recall-hits");
    list.replaceChildren();
    for (const hit of r.hits) {
      const li = document.createElement("li");
      li.textContent = `${hit.score.toFixed(3)} [${hit.kind}] ${hit.text} `;
      provenanceLink(li, hit.session_id, hit.turn_indexes);
      list.appendChild(li);
    }
    if (!r.hits.length) list.textContent = "nothing recalled";
  } catch (error) {
    setStatus(error.message);
  }
}

function showTab(name) {
  for (const button of document.querySelectorAll(".tabs button")) {
    button.classList.toggle("active", button.dataset.tab === name);
  }
  for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== `tab-${name}`;
}

document.querySelectorAll(".tabs button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
$("who").addEventListener("submit", loadUser);
$("context-form").addEventListener("submit", loadContext);
$("recall-form").addEventListener("submit", recall);
$("key").value = sessionStorage.getItem("tiermem.key") || "";
$("user").value =
  new URLSearchParams(location.search).get("user") || sessionStorage.getItem("tiermem.user") || "";
const params = new URLSearchParams(location.search);
if ($("user").value) {
  loadUser()
    .then(() => (params.get("session") ? loadSession(params.get("session")) : null))
    .then(() => { if (params.get("tab")) showTab(params.get("tab")); });
}
