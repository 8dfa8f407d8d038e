// Weir dashboard: plain JavaScript over the admin API (docs/DASHBOARD.md).
// Everything shown is put in the page with textContent (never innerHTML): the
// token lives in sessionStorage and no volume name may run as markup.
"use strict";

const TOKEN_KEY = "weir-admin-token";
const LIVE_SPAN = 300; // seconds the live charts keep
const state = { view: "levels", volume: null, range: "live", timer: null, charts: [], live: [], run: 0, refreshMs: 1000, notice: null };
const NOTICE_MS = 8000; // how long an action's result stays in the status line
window.weirCharts = state.charts; // read by the browser test

if (window.top !== window.self) document.documentElement.textContent = "";

// ---------- DOM helpers ----------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 0) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d });
const pct = (x) => fmt(100 * x) + " %";
const gib = (b) => b < 2 ** 30
  ? fmt(b / 2 ** 20, b % 2 ** 20 ? 2 : 0) + " MiB"
  : fmt(b / 2 ** 30, b % 2 ** 30 ? 2 : 0) + " GiB";

// ---------- API ----------
class ApiError extends Error { constructor(status, msg) { super(msg); this.status = status; } }

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + (sessionStorage.getItem(TOKEN_KEY) || "") };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: text }; }
  if (!r.ok) {
    if (r.status === 401) showLogin("The server refused the token.");
    throw new ApiError(r.status, (data && data.error) || r.statusText);
  }
  return data;
}

function setStatus(text, bad) {
  const s = $("status");
  s.textContent = text;
  s.className = bad ? "error" : "";
}

// ---------- sign-in ----------
function showLogin(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (message !== undefined) $("login-error").textContent = message;
  $("login").hidden = false;
  $("login-token").focus();
}

async function signIn(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("login-token").value.trim());
  try {
    await api("GET", "/v1/policies");
    $("login-token").value = "";
    $("login-error").textContent = "";
    $("login").hidden = true;
    route();
  } catch (e) {
    showLogin(e.status === 401 ? "Wrong token." : e.message);
  }
}

// ---------- confirmation ----------
function confirmAction(text) {
  return new Promise((resolve) => {
    $("confirm-text").textContent = text;
    $("confirm").hidden = false;
    const done = (answer) => () => { $("confirm").hidden = true; resolve(answer); };
    $("confirm-yes").onclick = done(true);
    $("confirm-no").onclick = done(false);
    $("confirm-yes").focus();
  });
}

/// Runs an action; its result (an error above all) stays in the status line
/// for NOTICE_MS, through the refreshes.
async function act(what, fn) {
  try {
    await fn();
    state.notice = { text: what + ": done", bad: false };
  } catch (e) {
    state.notice = { text: what + ": " + e.message, bad: true };
  }
  state.notice.until = Date.now() + NOTICE_MS;
  setStatus(state.notice.text, state.notice.bad);
  await refresh();
}

// ---------- views ----------
const views = {
  levels: { title: "Service levels", render: renderLevels },
  volumes: { title: "Volumes", render: renderVolumes },
  volume: { title: "Volume", render: renderVolume },
  policies: { title: "Policies", render: renderPolicies },
  pools: { title: "Pools", render: renderPools },
  hosts: { title: "Hosts", render: renderHosts },
  groups: { title: "Access groups", render: renderGroups },
};

function route() {
  if (location.hash.startsWith("#token=")) history.replaceState(null, "", location.pathname + "#levels");
  const [view, arg] = (location.hash.slice(1) || "levels").split("/");
  let volume = null;
  try { volume = arg ? decodeURIComponent(arg) : null; } catch (_) { volume = null; }
  // A volume's page without a (readable) name: the list.
  state.view = view === "volume" && !volume ? "volumes" : views[view] ? view : "levels";
  state.volume = volume;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === state.view);
  // A fresh <main>: a render of the view left behind (its answer still on its
  // way) fills the old, detached one, never this.
  const old = $("main");
  old.replaceWith(old.cloneNode(false));
  state.charts.length = 0;
  refresh();
}

/// Renders the view and schedules the next refresh: only the newest refresh
/// does (a route change while one waits would otherwise start a second loop).
/// Skipped while a control of the page has the focus (a policy list being
/// chosen from would be rebuilt under the pointer); slower when a render is
/// slow (2,000 volumes: ≈ 1 s of the browser's time).
async function refresh() {
  if (!sessionStorage.getItem(TOKEN_KEY)) return showLogin();
  clearTimeout(state.timer);
  const run = ++state.run;
  const main = $("main");
  const started = performance.now();
  try {
    if (!main.contains(document.activeElement) || !document.activeElement.matches("select, input, textarea")) {
      await views[state.view].render(main);
    }
    if (run !== state.run) return;
    const n = state.notice;
    if (n && Date.now() < n.until) setStatus(n.text, n.bad);
    else setStatus("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    if (run !== state.run) return;
    if (e.status !== 401) setStatus(e.message, true);
  }
  state.refreshMs = Math.min(10000, Math.max(1000, 3 * (performance.now() - started)));
  state.timer = setTimeout(refresh, state.refreshMs);
}

/// A section of `main` whose content is replaced on each refresh (charts are kept).
function section(main, id) {
  let el = main.querySelector("#" + id);
  if (!el) { el = h("section", { id }); main.append(el); }
  el.textContent = "";
  return el;
}

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
}

function meets(v) {
  if (v.iops === 0) return "idle";
  return v.target_met >= 1 && v.reservation_met >= 1 ? "ok" : "bad";
}

// Service levels: tiles per volume by level, and live totals per level.
async function renderLevels(main) {
  const live = await api("GET", "/v1/stats");
  pushLive(live);
  const levels = ["mission-critical", "business-critical", "non-critical", "none"];
  const byLevel = (lvl) => live.volumes.filter((v) => (v.service_level || "none") === lvl);
  const all = live.volumes;
  const busy = all.filter((v) => v.iops > 0);
  const s = section(main, "levels-summary");
  s.append(h("h2", {}, "Service levels"),
    h("p", { class: "summary" },
      h("span", { id: "meeting" }, `${busy.filter((v) => meets(v) === "ok").length} of ${busy.length} busy volumes meet their targets`),
      h("span", {}, `${all.length} volumes`),
      h("span", {}, `${fmt(sum(all, "iops"))} IOPS`),
      h("span", {}, `${fmt(sum(all, "mbps"), 1)} MB/s`)));
  chartsOnce(main, "levels-charts", () => levelCharts(levels));
  const t = section(main, "levels-tiles");
  for (const lvl of levels) {
    const vs = byLevel(lvl);
    if (!vs.length) continue;
    t.append(h("h2", {}, `${lvl} (${vs.length})`), h("div", { class: "tiles" }, vs.map(tile)));
  }
  if (main.isConnected) updateLevelCharts(levels);
}

function tile(v) {
  const target = v.latency_target_ms ? ` / ${fmt(v.latency_target_ms)} ms` : "";
  return h("div", { class: "tile " + meets(v), title: `${v.name}: policy ${v.policy}`, onclick: () => { location.hash = "volume/" + encodeURIComponent(v.name); } },
    h("b", {}, v.name),
    h("small", {}, `${fmt(v.iops)} IOPS · p99 ${fmt(v.p99_ms, 2)}${target}`));
}

const sum = (vs, k) => vs.reduce((a, v) => a + v[k], 0);

function pushLive(live) {
  if (!live.time || (state.live.length && state.live[state.live.length - 1].time === live.time)) return;
  state.live.push(live);
  while (state.live.length > LIVE_SPAN) state.live.shift();
}

function levelCharts(levels) {
  return [
    chart("IOPS by service level", levels.map((l) => ({ label: l })), 0),
    chart("worst p99 latency, % of its target, by service level", levels.map((l) => ({ label: l })), 1),
  ];
}

function updateLevelCharts(levels) {
  if (state.charts.length < 2) return;
  const t = state.live.map((l) => l.time);
  const of = (lvl, l) => l.volumes.filter((v) => (v.service_level || "none") === lvl);
  const iops = levels.map((lvl) => state.live.map((l) => sum(of(lvl, l), "iops")));
  const ratio = levels.map((lvl) => state.live.map((l) => {
    const r = of(lvl, l).filter((v) => v.latency_target_ms && v.iops > 0).map((v) => v.p99_ms / v.latency_target_ms);
    return r.length ? 100 * Math.max(...r) : null;
  }));
  state.charts[0].setData([t, ...iops]);
  state.charts[1].setData([t, ...ratio]);
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

/// A uPlot chart with `series` (labels), `digits` decimals on the axis.
function chart(title, series, digits) {
  const opts = {
    title, width: 560, height: 220,
    scales: { x: { time: true } },
    series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: s.stroke || COLORS[i % COLORS.length], dash: s.dash, width: 1.5, value: (u, v) => v === null ? "–" : fmt(v, digits) }))],
    axes: [{}, { size: 80, values: (u, vals) => vals.map((v) => fmt(v, digits)) }],
  };
  const el = h("div", { class: "chart" });
  const u = new uPlot(opts, [[], ...series.map(() => [])], el);
  u.holder = el;
  return u;
}

function chartsOnce(main, id, make) {
  if (!main.isConnected || main.querySelector("#" + id)) return;
  const box = h("section", { id, class: "charts" });
  main.append(box);
  for (const c of make()) { state.charts.push(c); box.append(c.holder); }
}

// Volumes: table with actions, create form.
async function renderVolumes(main) {
  const [live, policies, pools] = await Promise.all([api("GET", "/v1/stats"), api("GET", "/v1/policies"), api("GET", "/v1/pools")]);
  if (!main.querySelector("#create-volume")) main.append(createVolumeForm(policies, pools));
  const s = section(main, "volumes-table");
  s.append(h("h2", {}, `Volumes (${live.volumes.length})`), table(
    ["name", "pool", "policy", "size", "IOPS", "MB/s", "p99 ms", "target ms", "queued", "throttled", "meets", ""],
    live.volumes.map((v) => [
      h("a", { href: "#volume/" + encodeURIComponent(v.name) }, v.name), v.pool, v.policy, gib(v.size_bytes),
      fmt(v.iops), fmt(v.mbps, 1), fmt(v.p99_ms, 2), fmt(v.latency_target_ms), fmt(v.queued, 1), pct(v.throttled), meets(v),
      volumeActions(v, policies)])));
}

function volumeActions(v, policies) {
  const select = h("select", { "aria-label": "policy of " + v.name, onchange: (e) => act(`policy of ${v.name}`, () => api("POST", `/v1/volumes/${encodeURIComponent(v.name)}/policy`, { policy: e.target.value })) },
    policies.map((p) => h("option", { value: p.name, selected: p.name === v.policy }, p.name)));
  const resize = h("button", { type: "button", onclick: () => resizeVolume(v) }, "Resize");
  const del = h("button", { type: "button", class: "danger", onclick: () => deleteVolume(v) }, "Delete");
  return h("span", {}, select, " ", resize, " ", del);
}

async function resizeVolume(v) {
  const text = prompt(`New size of ${v.name} in GiB (now ${gib(v.size_bytes)}; volumes only grow):`);
  if (!text) return;
  const bytes = Math.round(Number(text) * 2 ** 30);
  if (!(bytes > 0)) return setStatus("resize: not a size: " + text, true);
  if (await confirmAction(`Grow ${v.name} to ${gib(bytes)}? Volumes cannot shrink.`))
    await act(`resize ${v.name}`, () => api("POST", `/v1/volumes/${encodeURIComponent(v.name)}/resize`, { size_bytes: bytes }));
}

async function deleteVolume(v) {
  if (await confirmAction(`Delete volume ${v.name} and all its data? This cannot be undone.`))
    await act(`delete ${v.name}`, () => api("DELETE", `/v1/volumes/${encodeURIComponent(v.name)}`));
}

function createVolumeForm(policies, pools) {
  const form = h("form", { id: "create-volume", class: "inline" },
    h("label", {}, "name", h("input", { name: "name", required: true })),
    h("label", {}, "size (GiB)", h("input", { name: "size", type: "number", min: "0.001", step: "any", value: "10", required: true })),
    h("label", {}, "policy", h("select", { name: "policy" }, policies.map((p) => h("option", { value: p.name }, p.name)))),
    h("label", {}, "pool", h("select", { name: "pool" }, pools.map((p) => h("option", { value: p.name }, p.name)))),
    h("button", { type: "submit" }, "Create volume"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const f = new FormData(form);
    act("create " + f.get("name"), () => api("POST", "/v1/volumes", {
      name: f.get("name"), size_bytes: Math.round(Number(f.get("size")) * 2 ** 30), policy: f.get("policy"), pool: f.get("pool"),
    }));
  });
  return form;
}

// One volume: live and historical charts.
const RANGES = { live: [300, 1], "1h": [3600, 10], "1d": [86400, 300], "30d": [2592000, 3600] };

async function renderVolume(main) {
  const name = state.volume;
  const v = await api("GET", "/v1/volumes/" + encodeURIComponent(name));
  const policy = await api("GET", "/v1/policies/" + encodeURIComponent(v.policy));
  const s = section(main, "volume-head");
  s.append(h("h2", {}, `${v.name} — ${v.pool}, ${gib(v.size_bytes)}, policy ${v.policy}`),
    h("p", {}, "range: ", Object.keys(RANGES).map((r) => h("button", { type: "button", disabled: r === state.range, onclick: () => { state.range = r; refresh(); } }, r))));
  chartsOnce(main, "volume-charts", volumeCharts);
  const [since, step] = RANGES[state.range];
  const series = await api("GET", `/v1/volumes/${encodeURIComponent(name)}/history?since=${since}&step=${step}`);
  const p = series.points;
  const col = (k, f = 1) => p.map((x) => x[k] * f);
  const t = p.map((x) => x.t);
  const target = p.map(() => policy.latency_target_ms ?? null);
  const resv = p.map(() => policy.reservation_iops ?? null);
  const data = [[t, col("iops"), resv], [t, col("mbps")], [t, col("p50_ms"), col("p99_ms"), target], [t, col("queued")], [t, col("throttled", 100)], [t, col("reservation_met", 100), col("target_met", 100)]];
  if (main.isConnected) data.forEach((d, i) => state.charts[i].setData(d));
}

function volumeCharts() {
  return [
    chart("IOPS", [{ label: "IOPS" }, { label: "reservation", dash: [6, 4], stroke: "#2ca02c" }], 0),
    chart("MB/s", [{ label: "MB/s" }], 1),
    chart("latency (ms)", [{ label: "p50" }, { label: "p99" }, { label: "target", dash: [6, 4], stroke: "#d62728" }], 2),
    chart("queued requests", [{ label: "queued" }], 1),
    chart("time throttled (%)", [{ label: "throttled" }], 0),
    chart("targets met (%)", [{ label: "reservation met" }, { label: "latency target met" }], 0),
  ];
}

// Policies: table, edit and create.
const POLICY_FIELDS = ["reservation_iops", "limit_iops", "reservation_mbps", "limit_mbps", "latency_target_ms", "shares", "burst_seconds"];

async function renderPolicies(main) {
  const [policies, volumes] = await Promise.all([api("GET", "/v1/policies"), api("GET", "/v1/volumes")]);
  if (!main.querySelector("#policy-form")) main.append(policyForm());
  const s = section(main, "policies-table");
  s.append(h("h2", {}, "Policies"), table(
    ["name", "service level", ...POLICY_FIELDS, "volumes", ""],
    policies.map((p) => [p.name, p.service_level || "–", ...POLICY_FIELDS.map((k) => fmt(p[k], k === "burst_seconds" ? 1 : 0)),
      String(volumes.filter((v) => v.policy === p.name).length),
      h("button", { type: "button", "data-edit": p.name, onclick: () => fillPolicyForm(p) }, "Edit")])));
}

function policyForm() {
  const form = h("form", { id: "policy-form", class: "inline" },
    h("label", {}, "name", h("input", { name: "name", required: true })),
    h("label", {}, "service level", h("select", { name: "service_level" }, ["", "mission-critical", "business-critical", "non-critical"].map((l) => h("option", { value: l }, l || "none")))),
    POLICY_FIELDS.map((k) => h("label", {}, k, h("input", { name: k, type: "number", step: "any", min: "0" }))),
    h("button", { id: "policy-save", type: "submit" }, "Save policy"),
    h("span", { class: "muted" }, "Edit replaces a policy you created (its volumes follow at once); a new name creates one."));
  form.addEventListener("submit", (e) => { e.preventDefault(); savePolicy(form); });
  return form;
}

function fillPolicyForm(p) {
  const form = $("policy-form");
  form.elements.name.value = p.name;
  form.elements.service_level.value = p.service_level || "";
  for (const k of POLICY_FIELDS) form.elements[k].value = p[k] ?? "";
  form.elements.limit_iops.focus();
}

async function savePolicy(form) {
  const f = new FormData(form);
  const name = f.get("name").trim();
  const body = { name, service_level: f.get("service_level") || null };
  for (const k of POLICY_FIELDS) {
    const x = f.get(k);
    if (x !== "") body[k] = k === "shares" ? Math.round(Number(x)) : Number(x);
  }
  if (body.shares === undefined) delete body.shares;
  const exists = (await api("GET", "/v1/policies")).some((p) => p.name === name);
  await act(`policy ${name}`, () => exists ? api("PUT", "/v1/policies/" + encodeURIComponent(name), body) : api("POST", "/v1/policies", body));
}

async function renderPools(main) {
  const pools = await api("GET", "/v1/pools");
  section(main, "pools-table").append(h("h2", {}, "Pools"), table(
    ["name", "QoS", "device", "in flight", "depth limit", "max in flight", "queued", "host windows"],
    pools.map((p) => [p.name, p.qos ? "on" : "off", p.device || "–", fmt(p.in_flight), fmt(p.depth_limit), fmt(p.max_in_flight), fmt(p.queued), String(p.host_windows.length)])));
}

async function renderHosts(main) {
  const live = await api("GET", "/v1/stats");
  section(main, "hosts-table").append(h("h2", {}, "Hosts (last second)"), table(
    ["host", "IOPS", "MB/s", "mean latency ms"],
    live.hosts.map((x) => [x.host, fmt(x.iops), fmt(x.mbps, 1), fmt(x.mean_ms, 2)])));
}

async function renderGroups(main) {
  const [groups, volumes] = await Promise.all([api("GET", "/v1/access-groups"), api("GET", "/v1/volumes")]);
  section(main, "groups-table").append(h("h2", {}, "Access groups"), table(
    ["name", "hosts", "identities", "volumes"],
    groups.map((g) => [g.name, (g.hosts || []).join(", "), (g.identities || []).join(", ") || "–",
      String(volumes.filter((v) => (v.access_groups || []).includes(g.name)).length)])));
}

// ---------- start ----------
function start() {
  // No sign-in links: a token in the address is kept in the browser's history
  // (on disk, offered by autocomplete, synced), whatever the page does after.
  if (location.hash.startsWith("#token=")) {
    history.replaceState(null, "", location.pathname + "#levels");
    sessionStorage.removeItem(TOKEN_KEY);
    $("login-error").textContent = "Sign-in links are not taken (the browser keeps the address in its history): paste the token.";
  }
  $("login-form").addEventListener("submit", signIn);
  $("logout").addEventListener("click", () => showLogin("Signed out."));
  window.addEventListener("hashchange", route);
  route();
}
start();
