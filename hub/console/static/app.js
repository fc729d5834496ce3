// gpufed console: fills the server-rendered page from the REST API and keeps it live.
// Every call carries the token from the header box (localStorage) as a Bearer token.
// Data is only ever written with textContent: nothing from the API is parsed as HTML.
"use strict";

const REFRESH_MS = 2000;
// Usage and bills scan the whole history on the hub: those pages refresh less often.
const SLOW_PAGES = { usage: 10000, burst: 10000 };
const LOG_MAX_CHARS = 256 * 1024;
const TOKEN_KEY = "gpufed.token";
const TEAM_KEY = "gpufed.team";
const COLORS = ["#2f6fde", "#e0782f", "#2ca05a", "#c7413c", "#8a5cc4", "#8c6d31", "#d15fae",
  "#5f6b7a", "#b5b82b", "#27aab8"];

function token() { return localStorage.getItem(TOKEN_KEY) || ""; }

async function api(path, options = {}) {
  const headers = Object.assign({ "Accept": "application/json" }, options.headers || {});
  const t = token();
  if (t) headers["Authorization"] = "Bearer " + t;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, Object.assign({}, options, { headers }));
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const message = body && body.message ? body.message : response.status + " " + response.statusText;
    const err = new Error(message);
    err.status = response.status;
    throw err;
  }
  return body;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fill(tableId, rows, empty) {
  const body = document.querySelector("#" + tableId + " tbody");
  const cols = document.querySelectorAll("#" + tableId + " thead th").length;
  body.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" },
    el("td", { colspan: cols }, empty))]));
}

function secs(value) {
  if (value === null || value === undefined) return "-";
  const s = Math.max(0, value);
  if (s < 90) return s.toFixed(1) + " s";
  if (s < 5400) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function gpus(spec) {
  if (spec.gpu_fraction) return String(spec.gpu_fraction);
  return spec.nodes > 1 ? spec.nodes + "x" + spec.gpus_per_node : String(spec.gpus_per_node);
}
function dollars(v) { return "$" + Number(v || 0).toFixed(2); }
function num(v) { return Number(v || 0).toLocaleString(undefined, { maximumFractionDigits: 2 }); }
function now() { return Date.now() / 1000; }

function showError(err) {
  const box = document.getElementById("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = (err.status === 401 || err.status === 403)
    ? "The hub refused this token (" + err.message + "). Enter a valid API token above."
    : "Cannot load: " + err.message;
}

// --- pages ---

async function fleet() {
  const spokes = await api("/v1/spokes");
  const models = {};
  const status = { ready: 0, suspect: 0, lost: 0, cordoned: 0 };
  for (const s of spokes) {
    status[s.status] = (status[s.status] || 0) + 1;
    if (s.cordoned) status.cordoned += 1;
    for (const [model, g] of Object.entries(s.gpus)) {
      const m = models[model] || (models[model] = { free: 0, total: 0 });
      if (s.status !== "lost") { m.free += g.free; m.total += g.total; }
    }
  }
  const cards = [el("div", { class: "card" }, el("b", {}, "Spokes"),
    el("span", {}, status.ready + " ready · " + status.suspect + " suspect · " + status.lost + " lost" +
      (status.cordoned ? " · " + status.cordoned + " cordoned" : "")))];
  for (const [model, m] of Object.entries(models).sort()) {
    cards.push(el("div", { class: "card", dataset: { model } }, el("b", {}, model),
      el("span", {}, num(m.free) + " free / " + num(m.total)),
      el("meter", { min: 0, max: m.total || 1, value: m.total - m.free, title: "in use" })));
  }
  document.getElementById("fleet-cards").replaceChildren(...cards);
  fill("spokes", spokes.map((s) => el("tr", { dataset: { spoke: s.id } },
    el("td", {}, s.id), el("td", {}, s.region), el("td", {}, s.kind),
    el("td", {}, el("span", { class: "status " + s.status }, s.status), cordonBadge(s.cordoned)),
    el("td", {}, s.nodes),
    el("td", {}, Object.entries(s.gpus).sort().map(([m, g]) => m + " " + num(g.free) + "/" + num(g.total)).join(", ")),
    el("td", {}, s.running), el("td", {}, secs(s.last_seen_s_ago) + " ago"))), "No spoke has reported yet.");
}

// A spoke taken out of placement (`gpufed cordon`): who, and why, on hover.
function cordonBadge(c) {
  if (!c) return "";
  const why = "cordoned by " + c.by + (c.reason ? ": " + c.reason : "");
  return el("span", { class: "status cordoned", title: why }, "cordoned");
}

async function queue() {
  const records = await api("/v1/workloads?phase=queued&limit=2000");
  records.sort((a, b) => (a.position || 1e9) - (b.position || 1e9) || a.submitted_at - b.submitted_at);
  fill("queue", records.map((r) => el("tr", { dataset: { id: r.id } },
    el("td", {}, r.position || "-"), el("td", { class: "mono" }, r.id), el("td", {}, r.spec.name),
    el("td", {}, r.spec.team), el("td", {}, r.spec.priority_class), el("td", {}, r.priority),
    el("td", {}, gpus(r.spec)), el("td", {}, secs(r.wait_s)),
    el("td", { class: "mono" }, r.reason || "-"), el("td", {}, whyWaits(r)))),
  "Nothing is waiting.");
}

// The hub's sentence, and the cloud instance burst is starting for it (or why it rents
// none), as `gpufed jobs` says.
function whyWaits(r) {
  const why = r.message || "not looked at yet";
  if (r.cloud_instance) return why + "; cloud instance " + r.cloud_instance;
  return r.cloud_refused ? why + "; no cloud instance: " + r.cloud_refused : why;
}

let selectedJob = null;
let logOffset = null;
let logEpoch = null;

async function jobs() {
  const team = document.getElementById("jobs-team").value.trim();
  const active = document.getElementById("jobs-active").checked;
  let path = "/v1/workloads?limit=200";
  if (team) path += "&team=" + encodeURIComponent(team);
  if (active) path += "&phase=queued,placed,running";
  const records = await api(path);
  fill("jobs", records.map((r) => {
    const live = ["queued", "placed", "running"].includes(r.phase);
    // Its waits and runs added up, as the hub counted them when it answered (as `gpufed jobs`
    // shows them); and why it waits or why it failed.
    const wait = r.wait_s;
    const run = r.run_s;
    const why = r.phase === "queued" ? whyWaits(r) : r.phase === "failed" ? r.message || "" : "";
    return el("tr", { dataset: { id: r.id }, class: r.id === selectedJob ? "selected" : "" },
      el("td", { class: "mono" }, el("a", { href: "#" + r.id, onclick: (e) => { e.preventDefault(); selectJob(r.id); } }, r.id)),
      el("td", {}, r.spec.name), el("td", {}, r.spec.team), el("td", {}, gpus(r.spec)),
      el("td", {}, el("span", { class: "phase " + r.phase }, r.phase)),
      el("td", {}, r.spoke_id || "-"), el("td", {}, secs(wait)), el("td", {}, secs(run)),
      el("td", { class: "why", title: why }, why),
      el("td", {}, live ? el("button", { class: "cancel", type: "button", onclick: () => cancelJob(r.id) }, "Cancel") : ""));
  }), "No jobs yet: submit one above.");
  if (selectedJob) await jobDetail();
}

function selectJob(id) {
  selectedJob = id;
  logOffset = null;
  logEpoch = null;
  document.getElementById("job-log").textContent = "";
  refreshSoon();
}

async function cancelJob(id) {
  try {
    await api("/v1/workloads/" + encodeURIComponent(id), { method: "DELETE" });
    showError(null);
  } catch (err) { showError(err); }
  refreshSoon();
}

async function jobDetail() {
  const r = await api("/v1/workloads/" + encodeURIComponent(selectedJob));
  document.getElementById("job-detail").hidden = false;
  document.getElementById("job-title").textContent = r.spec.name + " (" + r.id + "): " + r.phase;
  const t0 = r.submitted_at;
  document.getElementById("job-events").replaceChildren(...r.history.map((h) =>
    el("li", {}, el("span", { class: "mono" }, "+" + (h.at - t0).toFixed(3) + "s "),
      el("b", {}, h.event), h.spoke_id ? " on " + h.spoke_id : "", h.detail ? " — " + h.detail : "")));
  const state = document.getElementById("job-log-state");
  const pre = document.getElementById("job-log");
  try {
    let path = "/v1/workloads/" + encodeURIComponent(selectedJob) + "/log?max_bytes=65536";
    if (logOffset !== null) path += "&offset=" + logOffset;
    const chunk = await api(path);
    if (logEpoch !== null && chunk.epoch !== logEpoch) { pre.textContent = ""; }
    logEpoch = chunk.epoch;
    if (chunk.data) {
      pre.textContent = (pre.textContent + chunk.data).slice(-LOG_MAX_CHARS);
      pre.scrollTop = pre.scrollHeight;
    }
    logOffset = chunk.next_offset;
    state.textContent = "(" + chunk.size + " bytes, run " + chunk.epoch + ")";
  } catch (err) {
    state.textContent = "(" + err.message + ")";
  }
}

function newKey() {
  // crypto.getRandomValues, not randomUUID: a hub served over plain HTTP off loopback is no
  // secure context, where randomUUID is missing.
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function submitJob(event) {
  event.preventDefault();
  const form = event.target;
  const data = new FormData(form);
  const spec = {
    name: data.get("name"), team: data.get("team"), priority_class: data.get("priority_class"),
    gpus_per_node: Number(data.get("gpus_per_node")), nodes: Number(data.get("nodes")),
    command: ["/bin/sh", "-c", data.get("command")],
  };
  if (data.get("gpu_model")) spec.gpu_models = [data.get("gpu_model")];
  localStorage.setItem(TEAM_KEY, spec.team);
  const out = document.getElementById("submit-result");
  // One key for the job as filled in: a double click, or a submit sent again after a failure,
  // makes one job (the hub takes a key once); the next job, or a changed form, gets a new one.
  if (!form.dataset.key) form.dataset.key = newKey();
  const headers = { "Idempotency-Key": form.dataset.key };
  try {
    const r = await api("/v1/workloads", { method: "POST", body: JSON.stringify(spec), headers });
    delete form.dataset.key;
    out.textContent = "Submitted " + r.id;
    out.className = "ok";
    selectJob(r.id);
  } catch (err) {
    out.textContent = err.message;
    out.className = "error";
  }
}

async function teams() {
  const rows = await api("/v1/teams");
  fill("teams", rows.map((t) => el("tr", { dataset: { team: t.team } },
    el("td", {}, t.team, t.listed ? "" : el("small", {}, " (default quotas)")),
    el("td", {}, num(t.guaranteed)), el("td", {}, num(t.using)),
    el("td", { class: t.borrowing > 0 ? "borrow" : "" }, num(t.borrowing)),
    el("td", {}, Object.entries(t.models).sort().map(([m, q]) =>
      m + ": " + num(q.using) + " / " + num(q.guaranteed) + " / " + (q.limit === null ? "∞" : num(q.limit))).join("; ") || "-"),
    el("td", {}, t.queued), el("td", {}, t.weight), el("td", {}, dollars(t.cloud_cost)))),
  "No team has work or quotas yet.");
}

async function burst() {
  const [instances, usage] = await Promise.all([api("/v1/burst/instances"), api("/v1/usage")]);
  const bills = Object.fromEntries(usage.instances.map((b) => [b.burst_id, b]));
  const live = instances.filter((i) => ["requested", "running", "terminating"].includes(i.state));
  const rate = live.reduce((sum, i) => sum + i.price_per_hour, 0);
  document.getElementById("burst-cards").replaceChildren(
    el("div", { class: "card" }, el("b", {}, "Live instances"), el("span", { id: "burst-live" }, live.length)),
    el("div", { class: "card" }, el("b", {}, "Spending now"), el("span", {}, dollars(rate) + "/h")),
    el("div", { class: "card" }, el("b", {}, "Billed so far"), el("span", { id: "burst-total" }, dollars(usage.totals.cloud_cost))));
  instances.sort((a, b) => b.at - a.at);
  fill("instances", instances.map((i) => {
    const b = bills[i.burst_id] || {};
    return el("tr", { dataset: { id: i.burst_id } },
      el("td", { class: "mono" }, i.burst_id), el("td", {}, i.instance_type), el("td", {}, i.market),
      el("td", {}, i.team), el("td", {}, el("span", { class: "status " + i.state }, i.state)),
      el("td", {}, dollars(i.price_per_hour)), el("td", {}, secs(b.boot_s)), el("td", {}, secs(b.busy_s)),
      el("td", {}, secs(b.idle_s)), el("td", {}, dollars(b.cost)));
  }), "Burst has rented no instance.");
}

async function usage() {
  const windowS = Number(document.getElementById("usage-window").value);
  const since = now() - windowS;
  const [series, totals] = await Promise.all([
    api("/v1/usage/series?since=" + since + "&step=" + Math.max(1, windowS / 60)),
    api("/v1/usage?since=" + since),
  ]);
  chart("chart-gpus", series.t, series.gpus, "GPUs");
  chart("chart-cost", series.t, series.cost, "$");
  fill("usage", Object.entries(totals.rows).map(([team, r]) => el("tr", { dataset: { team } },
    el("td", {}, team), el("td", {}, r.gpu_hours_onprem.toFixed(3)), el("td", {}, r.gpu_hours_cloud.toFixed(3)),
    el("td", {}, r.attempts), el("td", {}, dollars(r.cloud_cost)))), "No usage in this window.");
  const t = totals.totals;
  document.querySelector("#usage tfoot").replaceChildren(el("tr", {}, el("th", {}, "Total"),
    el("th", {}, t.gpu_hours_onprem.toFixed(3)), el("th", {}, t.gpu_hours_cloud.toFixed(3)),
    el("th", {}, t.attempts), el("th", {}, dollars(t.cloud_cost))));
}

function chart(id, times, series, unit) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 900, H = 220, L = 50, B = 24, T = 10, R = 10;
  const box = document.getElementById(id);
  const names = Object.keys(series);
  let max = 0;
  for (const n of names) for (const v of series[n]) max = Math.max(max, v);
  max = max || 1;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  const x = (i) => L + (times.length > 1 ? i / (times.length - 1) : 0) * (W - L - R);
  const y = (v) => H - B - (v / max) * (H - B - T);
  const text = (tx, ty, s, anchor) => {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", tx); t.setAttribute("y", ty); t.setAttribute("text-anchor", anchor || "start");
    t.textContent = s; svg.append(t);
  };
  const axis = document.createElementNS(NS, "path");
  axis.setAttribute("d", "M" + L + " " + T + " V" + (H - B) + " H" + (W - R));
  axis.setAttribute("class", "axis");
  svg.append(axis);
  text(L - 6, T + 10, num(max) + " " + unit, "end");
  text(L - 6, H - B, "0", "end");
  if (times.length) {
    const fmt = (t) => new Date(t * 1000).toLocaleTimeString();
    text(L, H - 6, fmt(times[0]));
    text(W - R, H - 6, fmt(times[times.length - 1]), "end");
  }
  names.forEach((n, k) => {
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", series[n].map((v, i) => x(i) + "," + y(v)).join(" "));
    line.setAttribute("stroke", COLORS[k % COLORS.length]);
    line.setAttribute("class", "series");
    line.dataset.team = n;
    svg.append(line);
  });
  const legend = el("div", { class: "legend" }, names.length ? names.map((n, k) => {
    const item = el("span", {}, n);
    item.style.setProperty("--c", COLORS[k % COLORS.length]);  // CSSOM: allowed by the CSP
    return item;
  }) : "No data in this window.");
  box.replaceChildren(svg, legend);
}

// --- refresh loop and the token box ---

const PAGES = { fleet, queue, jobs, teams, burst, usage };
let timer = null;
let running = false;

async function refresh() {
  if (running) return;
  running = true;
  clearTimeout(timer);
  try {
    await PAGES[document.body.dataset.page]();
    showError(null);
    document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  } catch (err) {
    showError(err);
  } finally {
    running = false;
    timer = setTimeout(refresh, SLOW_PAGES[document.body.dataset.page] || REFRESH_MS);
  }
}
function refreshSoon() { clearTimeout(timer); timer = setTimeout(refresh, 0); }

function setup() {
  const input = document.getElementById("token");
  const state = document.getElementById("token-state");
  input.value = token();
  state.textContent = token() ? "token set" : "no token";
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = input.value.trim();
    if (value) localStorage.setItem(TOKEN_KEY, value); else localStorage.removeItem(TOKEN_KEY);
    state.textContent = value ? "token set" : "no token";
    refreshSoon();
  });
  const page = document.body.dataset.page;
  if (page === "jobs") {
    const team = localStorage.getItem(TEAM_KEY) || "";
    document.querySelector("#submit-form [name=team]").value = team;
    document.getElementById("jobs-team").value = team;
    const form = document.getElementById("submit-form");
    form.addEventListener("submit", submitJob);
    form.addEventListener("input", () => { delete form.dataset.key; });  // another job now
    document.getElementById("jobs-team").addEventListener("change", refreshSoon);
    document.getElementById("jobs-active").addEventListener("change", refreshSoon);
    if (location.hash.length > 1) selectedJob = decodeURIComponent(location.hash.slice(1));
  }
  if (page === "usage") document.getElementById("usage-window").addEventListener("change", refreshSoon);
  refresh();
}

document.addEventListener("DOMContentLoaded", setup);
