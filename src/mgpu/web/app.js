// mgpu dashboard: plain JavaScript, no build step, no outside resources.
// Pages (by URL hash): #/ overview, #/job/ID a job, #/accounting reports.
// Live: the overview polls two compact views (/api/dashboard/overview and one page of
// /api/dashboard/jobs) every POLL_MS, slower on a big cluster, and redraws only what
// changed (ETag); a job page follows its output through GET /api/jobs/ID/output?follow=1,
// opened again where it stood when its master restarts or another takes over (resume.js).
// The node heat map is heatmap.js.
"use strict";

const POLL_MS = 1500;
const POLL_MAX_MS = 15000;
const SMALL_CLUSTER = 16; // as mgpu.master.dashboard: up to this many nodes, all detailed
const UTIL_MS = 15000;
const OUTPUT_LIMIT = 1 << 20; // characters kept in the output pane

const $ = (id) => document.getElementById(id);
const state = {
  page: null, jobId: null, timer: null, utilTimer: null, stream: null, cancelErrors: {}, gen: 0,
  overview: null, open: new Set(), found: null, offset: 0, etags: {}, pollMs: POLL_MS, ready: false,
};

// ---- helpers ---------------------------------------------------------------

function esc(v) {
  return String(v == null ? "" : v).replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function dur(s) {
  if (s == null || s < 0) return "-";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60), sec = s % 60;
  const p = (n) => String(n).padStart(2, "0");
  if (d) return `${d}-${p(h)}:${p(m)}:${p(sec)}`;
  if (h) return `${h}:${p(m)}:${p(sec)}`;
  return `${m}:${p(sec)}`;
}

function ts(t) {
  if (!t) return "-";
  const d = new Date(t * 1000);
  return d.toLocaleString(undefined, { hour12: false });
}

function badge(text, cls) {
  return `<span class="badge ${esc(cls || text)}">${esc(text)}</span>`;
}

// A bar's width is set by sizeBars once it is in the page: the policy (style-src 'self')
// refuses style="..." in markup, not styles set from a script.
function bar(pct) {
  if (pct == null) return '<span class="muted">-</span>';
  const cls = pct >= 60 ? "high" : pct >= 20 ? "mid" : "";
  const w = Math.max(0, Math.min(100, Number(pct)));
  return `<span class="bar ${cls}"><i data-width="${w}"></i></span><span class="pct">${Math.round(pct)}%</span>`;
}

function sizeBars(root) {
  root.querySelectorAll(".bar > i[data-width]").forEach((i) => { i.style.width = i.dataset.width + "%"; });
}

function token() { return localStorage.getItem("mgpu-token") || ""; }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (token()) h.Authorization = "Bearer " + token();
  return h;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, opts = {}) {
  const resp = await fetch(path, { ...opts, headers: { ...headers(), ...(opts.headers || {}) } });
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (resp.status === 401) showLogin(body && body.detail);
  if (!resp.ok) {
    const detail = body && typeof body.detail === "string" ? body.detail : `HTTP ${resp.status}`;
    throw new ApiError(resp.status, detail);
  }
  return body;
}

// GET with the ETag of the answer last drawn in `slot` (if it was for the same path): null
// when the master says it has not changed.
async function apiCached(slot, path) {
  const h = headers();
  const last = state.etags[slot];
  if (last && last.path === path) h["If-None-Match"] = last.tag;
  const resp = await fetch(path, { headers: h, cache: "no-store" });
  if (resp.status === 304) return null;
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (resp.status === 401) showLogin(body && body.detail);
  if (!resp.ok) {
    throw new ApiError(resp.status, body && typeof body.detail === "string" ? body.detail : `HTTP ${resp.status}`);
  }
  state.etags[slot] = { path, tag: resp.headers.get("ETag") };
  return body;
}

function debounce(fn, ms) {
  let t = null;
  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
}

function setLive(ok, text) {
  const el = $("live");
  el.className = "live " + (ok ? "ok" : "down");
  el.textContent = text;
}

// ---- sign in ---------------------------------------------------------------

// Who a token signs in as (null: the master refuses it, or cannot be reached).
async function whoIs(t) {
  try {
    const resp = await fetch("/api/whoami", { headers: { Authorization: "Bearer " + t }, cache: "no-store" });
    return resp.ok ? await resp.json() : null;
  } catch (e) {
    return null;
  }
}

function named(who) {
  return who ? `${who.user}${who.admin ? " (admin)" : ""}` : "a token the master does not accept";
}

// A `#token=` (or `?token=`) link signs the page in.  Over a token it holds already, only
// when the reader agrees, asked by name: else anyone's link would silently turn an admin's
// dashboard into theirs (what it then shows or cancels is theirs).
async function takeTokenFromUrl() {
  const m = location.hash.match(/[#&]token=([^&]+)/);
  const q = new URLSearchParams(location.search).get("token");
  const t = m ? decodeURIComponent(m[1]) : q;
  if (!t) return;
  history.replaceState(null, "", location.pathname + "#/");
  const held = token();
  if (held && held !== t) {
    const [now, next] = await Promise.all([whoIs(held), whoIs(t)]);
    const same = now && next && now.user === next.user && now.admin === next.admin;
    const ask = `This link signs the dashboard in as ${named(next)}, in place of ${named(now)}. Switch?`;
    if (!same && !window.confirm(ask)) return;
  }
  localStorage.setItem("mgpu-token", t);
}

function showLogin(why) {
  $("login").hidden = false;
  $("login-error").textContent = token() ? (why || "this token was refused") : "";
  $("login-token").focus();
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("mgpu-token", $("login-token").value.trim());
  $("login").hidden = true;
  route();
});
$("token-button").addEventListener("click", () => showLogin());

// ---- cancel (two clicks: arm, then confirm) ---------------------------------

async function cancelJob(id, button, errorEl) {
  if (!button.classList.contains("armed")) {
    button.classList.add("armed");
    button.dataset.label = button.textContent;
    button.textContent = "Confirm cancel";
    setTimeout(() => {
      if (button.classList.contains("armed")) {
        button.classList.remove("armed");
        button.textContent = button.dataset.label;
      }
    }, 4000);
    return;
  }
  button.classList.remove("armed");
  button.disabled = true;
  button.dataset.busy = "1";
  button.textContent = "Cancelling…";
  if (errorEl) errorEl.textContent = "";
  try {
    const res = await api(`/api/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
    if (res && res.already_ended && res.already_ended.length && !(res.cancelled || []).length) {
      throw new ApiError(409, `job ${id} had already ended`);
    }
    button.textContent = "Cancelled";
  } catch (e) {
    button.disabled = false;
    button.textContent = button.dataset.label || "Cancel";
    if (errorEl) errorEl.textContent = "cancel refused: " + e.message;
    state.cancelErrors[id] = "cancel refused: " + e.message;
    delete button.dataset.busy;
    return; // keep the error in view; the next refresh redraws the row
  }
  delete button.dataset.busy;
  refresh();
}

// ---- overview ----------------------------------------------------------------
// Two compact views of the master (mgpu.master.dashboard), each with an ETag: the
// overview (counts, the heat map, the details of the nodes shown) and one page of jobs.

const PAGE_SIZE = 50;
const BIG_POLL_MS = 5000; // a big cluster (nodes or queued jobs) is polled less often
const BIG_NODES = 200, BIG_QUEUE = 10000;
const SEARCH_SHOWN = 12; // nodes a search lists by name

function gpuState(node, g) {
  if (node.state === "offline" || node.connected === false) return "offline";
  if (g.busy_job) return "busy";
  if ((g.shared_jobs || []).length) return "shared";
  if (g.foreign_blocked) return "foreign";
  return node.state === "online" ? "free" : node.state;
}

function renderStats(ov) {
  const stat = (n, l) => `<div class="stat"><div class="n">${n}</div><div class="l">${l}</div></div>`;
  const n = (v) => Number(v).toLocaleString("en");
  const g = ov.gpus, j = ov.jobs;
  $("stats").innerHTML =
    stat(`${n(ov.nodes.online)}/${n(ov.nodes.total)}`, "nodes online") +
    stat(`${n(g.busy + (g.shared || 0))}/${n(g.total)}`, "GPUs busy") +
    (g.shared ? stat(n(g.shared), "GPUs shared") : "") +
    stat(n(g.free), "GPUs free") +
    stat(n(g.foreign), "GPUs used outside mgpu") +
    stat(n(j.running), "jobs running" + (j.idle ? ` (${n(j.idle)} idle)` : "")) +
    stat(n(j.queued), "jobs queued");
}

// ---- nodes: the heat map, search and filter, details on demand

const heat = new HeatMap($("heatmap"), (id) => toggleNode(id));

const NODE_FILTERS = {
  "": () => true,
  online: (r) => r[1] === "online",
  free: (r) => r[1] === "online" && r[2].includes("f"),
  full: (r) => r[2].length > 0 && !/[fn]/.test(r[2]),
  draining: (r) => r[1] === "draining" || r[1] === "drained",
  reconnecting: (r) => r[1] === "reconnecting",
  offline: (r) => r[1] === "offline",
};

function nodeKeep() {
  const text = $("node-search").value.trim().toLowerCase();
  const want = NODE_FILTERS[$("node-filter").value] || NODE_FILTERS[""];
  return (r) => want(r) && (!text || r[0].toLowerCase().includes(text));
}

// Past SMALL_CLUSTER nodes, a node is detailed only when opened (and can be closed again).
function onDemand() { return state.overview && state.overview.nodes.total > SMALL_CLUSTER; }

// What the overview should detail: the nodes opened by a click, and a search's single match.
function openNodes() { return [...state.open, ...(state.found ? [state.found] : [])]; }

function drawHeat() {
  const ov = state.overview;
  if (!ov) return;
  const filtered = $("node-search").value.trim() || $("node-filter").value;
  heat.draw(ov.heat, filtered ? nodeKeep() : undefined, new Set(openNodes()));
}

function renderSearch() {
  const ov = state.overview;
  const text = $("node-search").value.trim();
  const el = $("node-matches");
  if (!ov || !(text || $("node-filter").value)) { el.innerHTML = ""; return; }
  const keep = nodeKeep();
  const hits = ov.heat.filter(keep);
  const names = hits.slice(0, SEARCH_SHOWN).map((r) =>
    `<button type="button" class="link-like" data-node="${esc(r[0])}">${esc(r[0])}</button>`).join(" ");
  el.innerHTML = `${hits.length.toLocaleString("en")} of ${ov.heat.length.toLocaleString("en")} nodes match` +
    (hits.length ? `: ${names}${hits.length > SEARCH_SHOWN ? " …" : ""}` : "");
}

// A search that names one node (exactly, or as the only match) opens its details.
function searchNodes() {
  const ov = state.overview;
  const text = $("node-search").value.trim().toLowerCase();
  let found = null;
  if (ov && text) {
    const exact = ov.heat.find((r) => r[0].toLowerCase() === text);
    const hits = exact ? [exact] : ov.heat.filter(nodeKeep());
    if (hits.length === 1) found = hits[0][0];
  }
  renderSearch();
  drawHeat();
  if (found !== state.found) {
    state.found = found;
    loadOverview().catch(() => {});
  }
}

function toggleNode(id) {
  if (state.open.has(id)) state.open.delete(id);
  else state.open.add(id);
  drawHeat();
  loadOverview().catch(() => {});
}

function gpuTable(n) {
  const names = Object.fromEntries((n.job_rows || []).map((j) => [j.id, j.name]));
  const rows = (n.gpus || []).map((g) => {
    const t = g.telemetry || {};
    const st = gpuState(n, g);
    const tenants = g.shared_jobs || [];
    const note = st === "foreign" && n.kubernetes ? ' <span class="note">held by a Pod outside mgpu</span>'
      : st === "foreign" ? ` <span class="note">${esc(t.foreign_memory_mb)} MB outside mgpu</span>`
      : (t.foreign_processes || []).length && st === "busy" ? ' <span class="note">+ foreign use</span>'
      : st === "shared" ? ` <span class="note">${esc(+g.share_used.toFixed(3))} used by ${tenants.length} job${tenants.length === 1 ? "" : "s"}</span>` : "";
    const mem = t.memory_used_mb == null ? "-"
      : `${(t.memory_used_mb / 1024).toFixed(1)} / ${((t.memory_total_mb || g.memory_mb) / 1024).toFixed(0)} GB`;
    const job = g.busy_job
      ? `<a href="#/job/${esc(g.busy_job)}">${esc(g.busy_job)}</a>${names[g.busy_job] ? ` <span class="muted">${esc(names[g.busy_job])}</span>` : ""}`
      : tenants.map((o) => `<a href="#/job/${esc(o.job_id)}">${esc(o.job_id)}</a>(${esc(o.share)})`).join(" ");
    const user = g.busy_user || [...new Set(tenants.map((o) => o.user || "?"))].join(",");
    return `<tr data-gpu="${esc(n.node_id)}:${g.index}">
      <td class="num">${g.index}</td>
      <td>${badge(st)}${note}</td>
      <td>${job}</td>
      <td>${esc(user)}</td>
      <td>${bar(t.utilization_pct)}</td>
      <td class="num">${mem}</td>
      <td class="num">${t.temperature_c == null ? "-" : Math.round(t.temperature_c) + " °C"}</td>
    </tr>`;
  }).join("");
  return `<table><thead><tr><th class="num">GPU</th><th>state</th><th>job</th><th>user</th><th>util</th><th class="num">memory</th><th class="num">temp</th></tr></thead>
    <tbody>${rows || '<tr><td colspan="7" class="empty">no GPUs</td></tr>'}</tbody></table>`;
}

function nodeJobs(n) {
  const cpuOnly = (n.job_rows || []).filter((j) => !j.gpus);
  if (!cpuOnly.length) return "";
  return `<div class="note">without GPUs: ${cpuOnly.map((j) =>
    `<a href="#/job/${esc(j.id)}">${esc(j.id)}</a> ${esc(j.name || "")} (${esc(j.user)})`).join(", ")}</div>`;
}

// CPUs and memory the node offers to jobs and what of them is free (where its agent says).
function hostUse(n) {
  const parts = [];
  if (n.cpus != null) parts.push(`CPUs ${esc(n.cpus_free)} free of ${esc(n.cpus)}`);
  if (n.mem_mb != null) parts.push(`memory ${(n.mem_free_mb / 1024).toFixed(1)} GB free of ${(n.mem_mb / 1024).toFixed(1)} GB`);
  return parts.length ? `<div class="note">${parts.join(" · ")}</div>` : "";
}

// A Kubernetes Node: its partition, and who holds its GPUs (mgpu's jobs' Pods, others' Pods).
function kubePods(n) {
  if (!n.kubernetes) return "";
  const gpus = (h) => `${esc(h.gpus)} GPU${h.gpus === 1 ? "" : "s"}`;
  const held = (n.gpu_holders || []).map((h) => h.kind === "job"
    ? `job <a href="#/job/${esc(h.job)}">${esc(h.job)}</a> (${h.pod ? "pod " + esc(h.pod) + ", " : ""}${gpus(h)})`
    : `pod ${esc(h.pod)} (${gpus(h)}, ${esc(h.phase)})`);
  return `<div class="note" data-kube="${esc(n.partition)}">Kubernetes partition ${esc(n.partition)}` +
    ` · GPUs held by: ${held.length ? held.join(", ") : "nobody"}</div>`;
}

// A node's card is its head and these sections, in order: add one here for a new view of a
// node (it gets the node's JSON from node_details in mgpu.master.dashboard).
const NODE_SECTIONS = [hostUse, kubePods, gpuTable, nodeJobs];

function nodeCard(n, closable) {
  const sim = (n.gpus || []).some((g) => g.telemetry && g.telemetry.simulated);
  const where = [n.hostname, n.ip].filter(Boolean).join(" · ");
  return `<div class="node" data-node="${esc(n.node_id)}">
    <div class="node-head"><b>${esc(n.node_id)}</b>${badge(n.connected === false && n.state !== "offline" ? "reconnecting" : n.state)}
      <span class="muted">${esc(where)}</span>${sim ? badge("simulated", "sim") : ""}
      ${n.reason ? `<span class="muted">${esc(n.reason)}</span>` : ""}
      ${closable ? `<span class="spacer"></span><button type="button" class="small" data-close="${esc(n.node_id)}" title="close">×</button>` : ""}</div>
    ${NODE_SECTIONS.map((section) => section(n)).join("")}
  </div>`;
}

function renderNodes(ov) {
  const el = $("nodes");
  if (!ov.heat.length) {
    el.innerHTML = '<div class="empty">No nodes yet: start one with <code>mgpu node --node-id node001</code>.</div>';
    return;
  }
  const closable = onDemand();
  const cards = ov.details.map((n) => nodeCard(n, closable && state.open.has(n.node_id))).join("");
  el.innerHTML = cards || '<div class="empty">Click a node in the map, or find one by name, to see its GPUs.</div>';
  sizeBars(el);
}

$("node-search").addEventListener("input", debounce(searchNodes, 150));
$("node-search").addEventListener("keydown", (ev) => {
  if (ev.key !== "Enter") return;
  const first = state.overview && state.overview.heat.find(nodeKeep());
  if (first && $("node-search").value.trim()) { state.open.add(first[0]); drawHeat(); loadOverview().catch(() => {}); }
});
$("node-filter").addEventListener("change", searchNodes);
$("node-matches").addEventListener("click", (ev) => {
  const b = ev.target.closest("button[data-node]");
  if (b && !state.open.has(b.dataset.node)) toggleNode(b.dataset.node);
});
$("nodes").addEventListener("click", (ev) => {
  const b = ev.target.closest("button[data-close]");
  if (b) toggleNode(b.dataset.close);
});

// ---- the job list: filtered and paged by the master

function jobWhere(j) {
  const alloc = j.allocation || [];
  if (j.state === "queued" || !alloc.length) return `<span class="muted">${esc(j.reason || j.state)}</span>`;
  const ids = (a) => a.gpu_ids.map((g) => j.gpu_share ? `${g}(${j.gpu_share})` : g).join(",");
  let text = alloc.map((a) => a.gpu_ids.length ? `${a.node_id}:${ids(a)}` : a.node_id).join(" ");
  if (!["queued", "running"].includes(j.state) && j.reason) text += ` (${j.reason})`;
  return esc(text);
}

function startIn(t, now) {
  if (!t) return "-";
  const wait = t - now;
  return wait < 30 ? "now" : "in " + dur(wait);
}

function waitsFor(j) {
  const held = j.waiting_on || [];
  if (!held.length || !j.expected_start) return "";
  const until = new Date(j.expected_start * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const jobs = held.filter((h) => !h.startsWith("reservation:"));
  const res = held.filter((h) => h.startsWith("reservation:")).map((h) => h.slice(12));
  const need = j.gpu_share ? `${j.gpu_share} of a GPU` : j.gpus === 1 ? "1 GPU" : `${j.gpus} GPUs`;
  const parts = [];
  if (jobs.length) {
    parts.push(`${esc(need)} held by job${jobs.length === 1 ? "" : "s"} ` +
      jobs.map((id) => `<a class="mono" href="#/job/${esc(id)}">${esc(id)}</a>`).join(", ") + ` until ~${esc(until)}`);
  }
  for (const name of res) parts.push(`reservation ${esc(name)} until ~${esc(until)}`);
  return parts.join("; ");
}

function renderUsers(users) {
  const sel = $("filter-user");
  const chosen = sel.value;
  const have = [...sel.options].map((o) => o.value).slice(1);
  const list = chosen && !users.includes(chosen) ? [...users, chosen].sort() : users;
  if (list.join() !== have.join()) {
    sel.innerHTML = '<option value="">everyone</option>' + list.map((u) => `<option>${esc(u)}</option>`).join("");
    sel.value = chosen;
  }
}

function renderQueue(page) {
  const now = Date.now() / 1000;
  const rows = page.jobs.map((j) => {
    const time = j.start_time ? dur((j.end_time || now) - j.start_time) : "-";
    const active = j.state === "queued" || j.state === "running";
    return `<tr data-job="${esc(j.id)}" data-user="${esc(j.user)}">
      <td><a class="mono" href="#/job/${esc(j.id)}">${esc(j.id)}</a></td>
      <td>${esc(j.name || "")}</td>
      <td>${esc(j.user)}</td>
      <td>${badge(j.state)}${j.idle ? badge("idle") : ""}</td>
      <td class="num">${j.gpu_share || j.gpus}</td>
      <td class="num">${time}</td>
      <td class="num">${j.state === "queued" ? startIn(j.expected_start, now) : ""}</td>
      <td>${jobWhere(j)}</td>
      <td>${active ? `<button class="danger small" data-cancel="${esc(j.id)}" type="button">Cancel</button>` : ""}<span class="error">${esc(state.cancelErrors[j.id] || "")}</span></td>
    </tr>`;
  });
  $("queue").innerHTML = rows.length
    ? `<table><thead><tr><th>job</th><th>name</th><th>user</th><th>state</th><th class="num">GPUs</th><th class="num">time</th><th class="num">start</th><th>nodes (reason)</th><th></th></tr></thead><tbody>${rows.join("")}</tbody></table>`
    : '<div class="empty">No jobs match.</div>';
  const n = (v) => v.toLocaleString("en");
  const first = page.total ? page.offset + 1 : 0, last = page.offset + page.jobs.length;
  const note = page.finished_window && page.total >= page.finished_window ? " (finished: the newest)" : "";
  $("queue-range").textContent = `${n(first)}–${n(last)} of ${n(page.total)}${note}`;
  $("queue-prev").disabled = page.offset === 0;
  $("queue-next").disabled = last >= page.total;
}

function jobsPath() {
  const q = new URLSearchParams({ state: $("filter-state").value, offset: state.offset, limit: PAGE_SIZE });
  if ($("filter-user").value) q.set("user", $("filter-user").value);
  if ($("job-search").value.trim()) q.set("q", $("job-search").value.trim());
  return "/api/dashboard/jobs?" + q;
}

async function loadJobs() {
  const path = jobsPath();
  const page = await apiCached("jobs", path);
  if (page === null) return; // unchanged
  // Not drawn: an answer overtaken by a newer question (the user paged or filtered), or an
  // armed or busy cancel button (it survives a refresh; the rows are redrawn the poll after).
  if (path !== jobsPath() || $("queue").querySelector("button.armed, button[data-busy]")) {
    delete state.etags.jobs;
    return;
  }
  if (page.total && page.offset >= page.total) { // the page emptied under us: back to the last one
    state.offset = Math.max(0, Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE);
    return loadJobs();
  }
  renderQueue(page);
}

async function loadOverview() {
  const open = openNodes();
  const ask = open.join(",");
  const ov = await apiCached("overview", "/api/dashboard/overview" + (ask ? "?open=" + encodeURIComponent(ask) : ""));
  if (ov === null) return; // unchanged
  if (ask !== openNodes().join(",")) { delete state.etags.overview; return; } // overtaken
  state.overview = ov;
  renderStats(ov);
  drawHeat();
  renderSearch();
  renderNodes(ov);
  renderUsers(ov.users);
}

function jobsChanged() { state.offset = 0; loadJobs().catch(() => {}); }

$("queue").addEventListener("click", (ev) => {
  const b = ev.target.closest("button[data-cancel]");
  if (b) cancelJob(b.dataset.cancel, b, b.nextElementSibling);
});
$("filter-state").addEventListener("change", jobsChanged);
$("filter-user").addEventListener("change", jobsChanged);
$("job-search").addEventListener("input", debounce(jobsChanged, 250));
$("queue-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE_SIZE); loadJobs().catch(() => {}); });
$("queue-next").addEventListener("click", () => { state.offset += PAGE_SIZE; loadJobs().catch(() => {}); });

async function refreshOverview() {
  const t0 = performance.now();
  await Promise.all([loadOverview(), loadJobs()]);
  if (!state.ready) { state.ready = true; performance.mark("mgpu-ready"); }
  // Poll slower when a refresh costs more (a big cluster, a loaded master).
  const ov = state.overview;
  const big = ov && (ov.nodes.total > BIG_NODES || ov.jobs.queued > BIG_QUEUE);
  state.pollMs = Math.min(POLL_MAX_MS, Math.max(big ? BIG_POLL_MS : POLL_MS, 8 * (performance.now() - t0)));
}

// ---- utilisation chart -------------------------------------------------------

async function refreshChart() {
  const hours = $("util-hours").value;
  const data = await api(`/api/utilisation?hours=${hours}&points=120`);
  drawChart(data);
}
$("util-hours").addEventListener("change", () => refreshChart().catch(() => {}));

function drawChart(data) {
  const el = $("chart");
  const W = Math.max(300, el.clientWidth || 800), H = el.clientHeight || 220;
  const L = 38, R = 10, T = 10, B = 24;
  const pts = data.points || [];
  const x = (t) => L + (t - data.start) / (data.end - data.start) * (W - L - R);
  const y = (p) => T + (1 - Math.max(0, Math.min(100, p)) / 100) * (H - T - B);
  let grid = "", axis = "";
  for (const p of [0, 25, 50, 75, 100]) {
    grid += `<line x1="${L}" x2="${W - R}" y1="${y(p)}" y2="${y(p)}"/>`;
    axis += `<text x="${L - 6}" y="${y(p) + 4}" text-anchor="end">${p}%</text>`;
  }
  const span = data.end - data.start;
  const ticks = 6;
  for (let i = 0; i <= ticks; i++) {
    const t = data.start + span * i / ticks;
    const d = new Date(t * 1000);
    const label = span > 2 * 86400
      ? d.toLocaleDateString(undefined, { month: "short", day: "numeric" })
      : d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", hour12: false });
    const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
    axis += `<text x="${x(t)}" y="${H - 6}" text-anchor="${anchor}">${label}</text>`;
  }
  let area = "";
  if (pts.length) {
    area = `M${x(pts[0].t)},${y(0)} ` + pts.map((p) => `L${x(p.t).toFixed(1)},${y(p.allocated_pct).toFixed(1)}`).join(" ") +
      ` L${x(pts[pts.length - 1].t)},${y(0)} Z`;
  }
  let meas = "", pen = false;
  for (const p of pts) {
    if (p.measured_pct == null) { pen = false; continue; }
    meas += `${pen ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.measured_pct).toFixed(1)} `;
    pen = true;
  }
  const now = data.now || {};
  el.innerHTML = `<svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" aria-label="GPU utilisation">
      <g class="grid">${grid}</g><g class="axis">${axis}</g>
      <path class="alloc" d="${area}"/><path class="meas" d="${meas}"/>
      <g class="hover" visibility="hidden"><line y1="${T}" y2="${H - B}"/></g>
    </svg>
    <div class="tip">now: ${now.allocated ?? 0}/${data.total_gpus} GPUs allocated (${Math.round(now.allocated_pct || 0)}%)${now.measured_pct == null ? "" : `, ${Math.round(now.measured_pct)}% measured`}</div>`;
  const svg = el.querySelector("svg"), hover = el.querySelector(".hover"), tip = el.querySelector(".tip");
  const base = tip.textContent;
  svg.addEventListener("mousemove", (ev) => {
    const r = svg.getBoundingClientRect();
    const px = (ev.clientX - r.left) / r.width * W;
    const t = data.start + (px - L) / (W - L - R) * span;
    const p = pts.reduce((a, b) => Math.abs(b.t - t) < Math.abs(a.t - t) ? b : a, pts[0] || { t });
    if (!p || p.allocated_pct == null) return;
    hover.setAttribute("visibility", "visible");
    hover.querySelector("line").setAttribute("x1", x(p.t));
    hover.querySelector("line").setAttribute("x2", x(p.t));
    tip.textContent = `${new Date(p.t * 1000).toLocaleTimeString(undefined, { hour12: false })}: ` +
      `${p.allocated_pct}% allocated` + (p.measured_pct == null ? "" : `, ${p.measured_pct}% measured`);
  });
  svg.addEventListener("mouseleave", () => { hover.setAttribute("visibility", "hidden"); tip.textContent = base; });
}

// ---- job page ----------------------------------------------------------------

function renderJob(j) {
  $("job-title").textContent = `Job ${j.id}` + (j.name ? ` (${j.name})` : "");
  $("job-state").innerHTML = badge(j.state) + (j.idle ? badge("idle") : "");
  const active = j.state === "queued" || j.state === "running";
  const btn = $("job-cancel");
  btn.hidden = !(active || btn.textContent === "Cancelled");
  const now = Date.now() / 1000;
  const rows = [
    ["user", esc(j.user)],
    ["state", esc(j.state) + (j.reason ? ` <span class="muted">(${esc(j.reason)})</span>` : "")],
    ["command", `<code>${esc(j.command)}</code>`],
    ["GPUs", esc(j.gpus) + (j.nodes ? ` on ${esc(j.nodes)} nodes` : "") + (j.gpu_share ? ` (a share of ${esc(j.gpu_share)})` : "")],
    ["submitted", ts(j.submit_time)],
    ["started", ts(j.start_time)],
    ["ended", ts(j.end_time)],
    ["elapsed", j.start_time ? dur((j.end_time || now) - j.start_time) : "-"],
    ["exit code", j.exit_code == null ? "-" : esc(j.exit_code)],
  ];
  if (j.time_limit) rows.push(["time limit", dur(j.time_limit)]);
  rows.push(["retries", `${esc(j.retries)} of ${esc(j.max_retries)}`]);
  if (j.priority_value != null) rows.push(["priority", Math.round(j.priority_value)]);
  if (j.reservation) rows.push(["reservation", esc(j.reservation)]);
  if (j.cpus || j.mem_mb) {
    rows.push(["per node", `${j.cpus ? esc(j.cpus) + " CPUs" : "CPUs shared"}, ` +
      (j.mem_mb ? `${(j.mem_mb / 1024).toFixed(1)} GB memory` : "memory shared")]);
  }
  if (j.max_rss_mb != null) rows.push(["peak memory", `${(j.max_rss_mb / 1024).toFixed(1)} GB`]);
  if (j.expected_start) rows.push(["expected start", `${ts(j.expected_start)} (${startIn(j.expected_start, now)})`]);
  if (waitsFor(j)) rows.push(["waits for", waitsFor(j)]);
  if (j.gpu_util_mean != null || j.gpu_memory_peak_mb != null) {
    rows.push(["GPU use", `mean ${j.gpu_util_mean == null ? "-" : Math.round(j.gpu_util_mean) + "%"} utilisation, ` +
      `peak ${j.gpu_memory_peak_mb == null ? "-" : (j.gpu_memory_peak_mb / 1024).toFixed(1) + " GB"} memory`]);
  }
  if (j.idle) rows.push(["idle", `GPUs near 0% since ${ts(j.idle_since)}`]);
  for (const a of j.allocation || []) {
    rows.push(["ran on", `${esc(a.node_id)} GPUs ${esc(a.gpu_ids.join(",") || "none")} · host ${esc(a.hostname || "-")} · ip ${esc(a.ip || "-")} · pid ${esc(a.pid || "-")}`]);
  }
  $("job-details").innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
  const att = (j.attempts || []).map((a, i) => {
    const gpus = Object.entries(a.gpu_ids || {}).map(([n, g]) => `${n}:${g.join(",")}`).join(" ");
    const d = a.start_time ? dur((a.end_time || now) - a.start_time) : "-";
    return `<tr><td class="num">${i + 1}</td><td>${esc(gpus || a.nodes.join(" "))}</td><td>${ts(a.start_time)}</td>
      <td>${ts(a.end_time)}</td><td class="num">${d}</td><td>${esc(a.end_reason || (a.end_time ? "" : "running"))}</td></tr>`;
  });
  $("job-attempts").innerHTML = att.length
    ? `<table><thead><tr><th class="num">#</th><th>nodes:GPUs</th><th>start</th><th>end</th><th class="num">duration</th><th>ended because</th></tr></thead><tbody>${att.join("")}</tbody></table>`
    : '<div class="empty">Not started yet.</div>';
}

async function refreshJob() {
  const j = await api(`/api/jobs/${encodeURIComponent(state.jobId)}`);
  if (state.page === "job" && state.jobId === j.id) renderJob(j);
}

function appendOutput(rec, multi) {
  const pre = $("output");
  const span = document.createElement("span");
  if (rec.s === "e") span.className = "e";
  let text = rec.d;
  if (multi && rec.n) text = text.replace(/^(?=.)/gm, `[${rec.n}] `);
  span.textContent = text;
  pre.appendChild(span);
  while (pre.textContent.length > OUTPUT_LIMIT && pre.firstChild) pre.removeChild(pre.firstChild);
  if ($("output-scroll").checked) pre.scrollTop = pre.scrollHeight;
}

const FOLLOW_QUIET_MS = 16000;
// A followed stream with nothing, not even a ping, this long is dropped and opened again:
// the master pings every 5 s, so it has stopped (a frozen leader keeps the connection).
const FOLLOW_RETRY_MAX_MS = 5000;

class FollowRefused extends Error {}
// The master refused the stream for good (no such job, not allowed): not opened again.

// The output pane's last word on a job that ended (its end record, or its JSON).
function endedText(job) {
  return `ended: ${job.state}` + (job.exit_code == null ? "" : ` (exit ${job.exit_code})`);
}

// Follows the job's output until it ends or the page leaves it. A stream that breaks or goes
// quiet (the master restarted, or another took over) is opened again where the stored
// records end (OutputResume): no line shown twice or lost.
async function followOutput(id) {
  const ctrl = new AbortController();
  state.stream = ctrl;
  $("output").textContent = "";
  const status = $("output-status");
  status.textContent = "following…";
  const nodes = new Set();
  const resume = new OutputResume();
  let tries = 0;
  while (!ctrl.signal.aborted) {
    let why;
    try {
      if (await readOutput(id, resume, nodes, ctrl.signal, () => { tries = 0; })) return;
      const j = await api(`/api/jobs/${encodeURIComponent(id)}`);
      if (j.state !== "queued" && j.state !== "running") {
        status.textContent = endedText(j);
        refreshJob().catch(() => {});
        return;
      }
      why = "the master ended the stream early";
    } catch (e) {
      if (ctrl.signal.aborted) return; // the page left this job
      if (e instanceof OutputRewind) continue;
      if (e instanceof FollowRefused) {
        status.textContent = "cannot follow: " + e.message;
        return;
      }
      why = e.message;
    }
    resume.reopen();
    tries += 1;
    status.textContent = `reconnecting (${why})…`;
    await new Promise((done) => setTimeout(done, Math.min(FOLLOW_RETRY_MAX_MS, 250 * 2 ** tries)));
  }
}

// One open of the job's output stream from where `resume` stands: true once the job's end
// was read, false when the stream closed before it. Throws on a broken or quiet stream.
async function readOutput(id, resume, nodes, pageSignal, onOutput) {
  const open = new AbortController();
  const leave = () => open.abort();
  pageSignal.addEventListener("abort", leave);
  let quiet = null;
  const awake = () => {
    clearTimeout(quiet);
    quiet = setTimeout(() => open.abort(new Error("the master went quiet")), FOLLOW_QUIET_MS);
  };
  try {
    awake();
    const url = `/api/jobs/${encodeURIComponent(id)}/output?follow=1&marks=1&since=${resume.since()}`;
    const resp = await fetch(url, { headers: headers(), signal: open.signal });
    if (!resp.ok) {
      let detail = `HTTP ${resp.status}`;
      try { detail = (await resp.json()).detail || detail; } catch (e) { /* not JSON */ }
      if (resp.status === 401) showLogin(detail);
      if (resp.status >= 500 || resp.status === 429) throw new Error(detail); // a standby, a restart
      throw new FollowRefused(detail);
    }
    const status = $("output-status");
    status.textContent = "following…";
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      awake();
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (!line.trim()) continue;
        const rec = JSON.parse(line);
        if ("d" in rec) {
          const text = resume.take(rec);
          if (text === null) continue;
          onOutput();
          if (rec.n) nodes.add(rec.n);
          appendOutput({ ...rec, d: text }, nodes.size > 1);
        } else if ("stored" in rec) {
          resume.mark(rec.stored);
        } else if (rec.end) {
          status.textContent = endedText(rec) + (rec.reason ? ` — ${rec.reason}` : "");
          refreshJob().catch(() => {});
          return true;
        } else if (rec.status) {
          status.textContent = rec.status === "queued"
            ? `queued${rec.position ? ` (position ${rec.position})` : ""}: ${rec.reason || ""}`
            : "following…";
        }
      }
    }
  } finally {
    clearTimeout(quiet);
    pageSignal.removeEventListener("abort", leave);
  }
}

$("job-cancel").addEventListener("click", () => cancelJob(state.jobId, $("job-cancel"), $("job-cancel-error")));

// ---- accounting ----------------------------------------------------------------

function rate(v) { return v == null ? "-" : Math.round(v * 100) + "%"; }
function wait(v) { return v == null ? "-" : v < 60 ? v.toFixed(1) + " s" : dur(v); }

async function refreshAccounting() {
  const by = $("report-by").value, since = $("report-since").value;
  const [rep, hist] = await Promise.all([
    api(`/api/report?by=${by}&since=${since}`),
    api(`/api/history?since=${since}&limit=200`),
  ]);
  const row = (r, label) => `<tr><td>${esc(label || r.key)}</td><td class="num">${r.jobs}</td><td class="num">${r.gpu_hours.toFixed(r.gpu_hours < 10 ? 3 : 1)}</td>
    <td class="num">${rate(r.success_rate)}</td><td class="num">${wait(r.mean_wait)}</td><td class="num">${wait(r.p90_wait)}</td></tr>`;
  $("report").innerHTML = rep.rows.length
    ? `<table><thead><tr><th>${by}</th><th class="num">jobs</th><th class="num">GPU-hours</th><th class="num">success</th><th class="num">mean wait</th><th class="num">p90 wait</th></tr></thead>
       <tbody>${rep.rows.map((r) => row(r)).join("")}${row(rep.total, "total")}</tbody></table>`
    : '<div class="empty">No finished jobs in this period.</div>';
  const h = hist.jobs.map((j) => `<tr><td><a class="mono" href="#/job/${esc(j.id)}">${esc(j.id)}</a></td><td>${esc(j.name || "")}</td>
    <td>${esc(j.user)}</td><td>${badge(j.state)}</td><td class="num">${j.gpus}</td><td>${esc(j.nodes.join(","))}</td>
    <td class="num">${wait(j.wait)}</td><td class="num">${dur(j.runtime)}</td><td class="num">${j.gpu_hours.toFixed(3)}</td>
    <td class="num">${j.exit_code == null ? "-" : esc(j.exit_code)}</td><td>${ts(j.end_time)}</td></tr>`);
  $("history").innerHTML = h.length
    ? `<table><thead><tr><th>job</th><th>name</th><th>user</th><th>state</th><th class="num">GPUs</th><th>nodes</th><th class="num">wait</th><th class="num">runtime</th><th class="num">GPU-h</th><th class="num">exit</th><th>ended</th></tr></thead><tbody>${h.join("")}</tbody></table>`
    : '<div class="empty">No finished jobs in this period.</div>';
}
$("report-by").addEventListener("change", () => refreshAccounting().catch(() => {}));
$("report-since").addEventListener("change", () => refreshAccounting().catch(() => {}));

// ---- routing and the refresh loop ----------------------------------------------

async function refresh() {
  try {
    if (state.page === "overview") await refreshOverview();
    else if (state.page === "job") await refreshJob();
    else if (state.page === "accounting") await refreshAccounting();
    setLive(true, "live · " + new Date().toLocaleTimeString(undefined, { hour12: false }));
  } catch (e) {
    setLive(false, e.status === 401 ? "not signed in" : e.status === 404 ? "not found" : "master unreachable");
    if (state.page === "job" && e.status === 404) $("job-title").textContent = `No job ${state.jobId}`;
  }
}

// The next refresh is set once this one is done, so that slow answers never pile up.
function schedule(gen) {
  const ms = state.page === "accounting" ? 10 * POLL_MS : state.page === "overview" ? state.pollMs : POLL_MS;
  state.timer = setTimeout(async () => {
    if (gen !== state.gen) return;
    if (!document.hidden) await refresh();
    if (gen === state.gen) schedule(gen);
  }, ms);
}

function route() {
  const hash = location.hash || "#/";
  const m = hash.match(/^#\/job\/([^/?#]+)/);
  const page = m ? "job" : hash.startsWith("#/accounting") ? "accounting" : "overview";
  if (state.stream) { state.stream.abort(); state.stream = null; }
  clearTimeout(state.timer);
  clearInterval(state.utilTimer);
  const gen = ++state.gen;
  state.etags = {};
  state.page = page;
  state.jobId = m ? decodeURIComponent(m[1]) : null;
  for (const p of ["overview", "job", "accounting"]) $("page-" + p).hidden = p !== page;
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === page));
  if (page === "job") {
    const btn = $("job-cancel");
    btn.disabled = false;
    btn.classList.remove("armed");
    btn.textContent = "Cancel job";
    btn.hidden = false;
    $("job-cancel-error").textContent = "";
    $("job-details").innerHTML = "";
    $("job-attempts").innerHTML = "";
    followOutput(state.jobId);
  }
  if (page === "overview") state.utilTimer = setInterval(() => refreshChart().catch(() => {}), UTIL_MS);
  refresh().finally(() => {
    if (gen !== state.gen) return;
    if (page === "overview") refreshChart().catch(() => {}); // after the first render, not beside it
    schedule(gen);
  });
}

window.addEventListener("hashchange", route);
window.addEventListener("resize", debounce(() => {
  if (state.page !== "overview") return;
  refreshChart().catch(() => {});
  drawHeat();
}, 100));
takeTokenFromUrl().finally(route);
