// Fulcrum console: polls the admin API once a second and draws what it sees. No framework, no
// build step; every value from the API goes into the page as text, never as HTML.
"use strict";

const REFRESH_MS = 1000;
const TOKEN_KEY = "fulcrum.token";
const COLORS = ["#38bdf8", "#22c55e", "#f59e0b", "#a78bfa", "#f472b6", "#2dd4bf", "#fb7185", "#facc15"];

// The token may come in the URL fragment (`/ui/#token=...`, never sent to any server); it is
// moved to sessionStorage and wiped from the address bar and history.
(function takeTokenFromFragment() {
  const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
})();

const state = {
  history: [],          // samples from /api/v1/history, oldest first
  lastT: 0,
  gslb: true,           // false once /api/v1/gslb answered 404 (a build without GSLB)
  links: false,         // link or gateway pools configured (from /api/v1/status)
  ha: false,            // [ha] configured (from /api/v1/status)
  filters: false,       // an http service has proxy-wasm filters (from /api/v1/status)
  lastOk: 0,
  certs: null,          // /api/v1/certificates, re-read every 30 s
  certsAt: 0,
  rows: new Map(),      // key -> row record, so rows are updated in place (clicks survive refreshes)
  pools: new Map(),
};

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}

function headers(json) {
  const h = { "Accept": "application/json" };
  const t = sessionStorage.getItem(TOKEN_KEY);
  if (t) h["Authorization"] = "Bearer " + t;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const r = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  if (!r.ok) {
    const msg = (data && (data.error || (data.errors && data.errors.join("; ")))) || r.statusText;
    throw new ApiError(r.status, msg);
  }
  return data;
}

function fmt(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (digits === undefined) digits = n < 10 && n % 1 !== 0 ? 1 : 0;
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return n.toFixed(digits);
}

function ago(unixSecs) {
  const d = Math.max(0, Date.now() / 1000 - unixSecs);
  if (d < 60) return Math.round(d) + " s ago";
  if (d < 3600) return Math.round(d / 60) + " min ago";
  if (d < 86400) return (d / 3600).toFixed(1) + " h ago";
  return new Date(unixSecs * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function setText(node, text) { if (node.textContent !== text) node.textContent = text; }

function banner(text, good) {
  const b = $("banner");
  if (!text) { b.classList.add("hidden"); return; }
  b.textContent = text;
  b.classList.toggle("good", !!good);
  b.classList.remove("hidden");
}

// ---- charts ---------------------------------------------------------------------------------

function sizeCanvas(c) {
  const r = window.devicePixelRatio || 1;
  const w = Math.max(10, Math.round(c.clientWidth * r)), h = Math.max(10, Math.round(c.clientHeight * r));
  if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
  return r;
}

// series: [{name, color, points: [[t, v], ...]}]; times in Unix seconds.
function drawChart(canvas, series, spanSecs) {
  const r = sizeCanvas(canvas);
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  g.clearRect(0, 0, W, H);
  const now = Date.now() / 1000, t0 = now - spanSecs;
  let max = 0;
  for (const s of series) for (const [, v] of s.points) max = Math.max(max, v);
  max = max <= 0 ? 1 : niceMax(max);
  const padL = 44 * r, padB = 16 * r, padT = 6 * r;
  g.font = `${11 * r}px system-ui, sans-serif`;
  g.fillStyle = "#8a9bb8"; g.strokeStyle = "rgba(35,48,77,.9)"; g.lineWidth = 1;
  for (let i = 0; i <= 3; i++) {
    const y = padT + (H - padT - padB) * (1 - i / 3);
    g.beginPath(); g.moveTo(padL, y); g.lineTo(W, y); g.stroke();
    g.fillText(fmt(max * i / 3), 2 * r, y + 4 * r);
  }
  const step = spanSecs / 5;
  for (let k = 0; k <= 5; k++) {
    const secs = k * step;
    const x = padL + (W - padL) * (1 - secs / spanSecs);
    const label = k === 0 ? "now" : secs < 60 ? `-${secs}s` : `-${secs / 60}m`;
    g.fillText(label, x - (k === 0 ? 22 : k === 5 ? 0 : 12) * r, H - 2 * r);
  }
  for (const s of series) {
    g.strokeStyle = s.color; g.lineWidth = 1.6 * r; g.beginPath();
    let first = true;
    for (const [t, v] of s.points) {
      if (t < t0) continue;
      const x = padL + (W - padL) * (t - t0) / spanSecs;
      const y = padT + (H - padT - padB) * (1 - v / max);
      if (first) { g.moveTo(x, y); first = false; } else g.lineTo(x, y);
    }
    g.stroke();
  }
}

function niceMax(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function spark(canvas, points, color) {
  const r = sizeCanvas(canvas);
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  g.clearRect(0, 0, W, H);
  if (points.length < 2) return;
  const max = Math.max(1e-9, ...points);
  g.strokeStyle = color; g.lineWidth = 1.4 * r; g.beginPath();
  points.forEach((v, i) => {
    const x = W * i / (points.length - 1), y = H - 2 * r - (H - 4 * r) * v / max;
    if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
  });
  g.stroke();
}

function legend(node, names) {
  const key = names.join("\u0000");
  if (node.dataset.key === key) return;
  node.dataset.key = key;
  // Through the CSSOM: the page's CSP refuses style attributes.
  node.replaceChildren(...names.map((n, i) => {
    const swatch = el("i");
    swatch.style.background = COLORS[i % COLORS.length];
    return el("span", {}, swatch, n);
  }));
}

function serviceSeries(field) {
  const names = [];
  const byName = new Map();
  for (const s of state.history) {
    for (const v of s.services) {
      if (!byName.has(v.name)) { byName.set(v.name, []); names.push(v.name); }
      byName.get(v.name).push([s.t, v[field]]);
    }
  }
  return names.map((n, i) => ({ name: n, color: COLORS[i % COLORS.length], points: byName.get(n) }));
}

function lastSample() { return state.history[state.history.length - 1]; }

function memberTrend(pool, address) {
  const pts = [];
  for (const s of state.history.slice(-120)) {
    const m = s.members.find((x) => x.pool === pool && x.address === address);
    if (m) pts.push(m.requests_per_s || m.connections_per_s);
  }
  return pts;
}

// ---- tables ---------------------------------------------------------------------------------

function row(tbody, key, cellCount, build) {
  let rec = state.rows.get(key);
  if (!rec || !rec.tr.isConnected || rec.tr.parentNode !== tbody) {
    const tds = [];
    for (let i = 0; i < cellCount; i++) tds.push(el("td"));
    const tr = el("tr", { "data-key": key }, ...tds);
    rec = { tr, tds };
    if (build) build(rec);
    state.rows.set(key, rec);
  }
  rec.seen = true;
  tbody.append(rec.tr); // moves it into order
  return rec;
}

function prune(tbody) {
  for (const tr of [...tbody.children]) {
    const rec = state.rows.get(tr.dataset.key);
    if (!rec || !rec.seen) { tr.remove(); state.rows.delete(tr.dataset.key); }
  }
  for (const rec of state.rows.values()) if (rec.tr.parentNode === tbody) rec.seen = false;
}

function pill(td, text, cls) {
  let p = td.firstChild;
  if (!p || p.nodeName !== "SPAN") { td.replaceChildren(); p = el("span"); td.append(p); }
  p.className = "pill " + cls;
  setText(p, text);
}

function renderServices(status) {
  const tbody = $("services").tBodies[0];
  const sample = lastSample();
  const bySample = new Map((sample ? sample.services : []).map((s) => [s.name, s]));
  let rps = 0, cps = 0, eps = 0, active = 0;
  const names = status.virtual_services.map((s) => s.name);
  for (const v of status.virtual_services) {
    const s = bySample.get(v.name) || {};
    rps += s.requests_per_s || 0; cps += s.connections_per_s || 0; eps += s.errors_per_s || 0;
    active += v.connections_active;
    const rec = row(tbody, "svc:" + v.name, 15, (rec) => {
      rec.tds[3].className = rec.tds[4].className = rec.tds[5].className = rec.tds[6].className = "num";
      for (let i = 7; i <= 12; i++) rec.tds[i].className = "num";
      rec.tds[2].className = "addr";
      rec.tds[11].classList.add("classes");
      rec.canvas = el("canvas", { class: "spark" });
      rec.tds[13].append(rec.canvas);
      rec.tds[14].append(el("button", { type: "button", class: "act", "data-action": "edit",
        onclick: () => openEditor("service", { name: rec.name }) }, "Edit…"));
    });
    rec.name = v.name;
    const t = rec.tds;
    setText(t[0], v.name); setText(t[1], v.protocol); setText(t[2], v.listen.join(", "));
    setText(t[3], fmt(s.requests_per_s)); setText(t[4], fmt(s.connections_per_s));
    setText(t[5], fmt(s.errors_per_s)); setText(t[6], fmt(v.connections_active));
    setText(t[7], fmt(v.connections_total)); setText(t[8], fmt(v.no_member));
    setText(t[9], fmt(v.over_limit)); setText(t[10], fmt(v.upstream_failures));
    const r = v.responses;
    setText(t[11], r ? ["1xx", "2xx", "3xx", "4xx", "5xx"].map((c) => fmt(r[c])).join(" / ") : "–");
    t[11].classList.toggle("bad", !!(r && r["5xx"] > 0));
    setText(t[12], s.cache_hit_ratio === undefined ? "–" : (s.cache_hit_ratio * 100).toFixed(1) + " %");
    const i = names.indexOf(v.name);
    spark(rec.canvas, state.history.slice(-120).map((h) => {
      const x = h.services.find((y) => y.name === v.name);
      return x ? (x.requests_per_s || x.connections_per_s) : 0;
    }), COLORS[i % COLORS.length]);
  }
  prune(tbody);
  if (!status.virtual_services.length) tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: "15" }, "No virtual services configured.")));
  setText($("t-rps"), fmt(rps)); setText($("t-cps"), fmt(cps));
  setText($("t-eps"), fmt(eps)); $("t-eps").className = eps > 0 ? "bad" : "";
  setText($("t-active"), fmt(active));
}

function memberReason(m) {
  const failing = (m.checks || []).filter((c) => !c.up);
  const last = m.transitions && m.transitions.length ? m.transitions[m.transitions.length - 1] : null;
  if (failing.length) return { text: failing.map((c) => `${c.monitor}: ${c.last}`).join("; "), bad: true };
  if (m.health === "down" && last) return { text: last.reason, bad: true };
  if (m.checks && m.checks.length) return { text: m.checks.map((c) => `${c.monitor}: ${c.last || "pending"}`).join("; "), bad: false };
  return { text: "no monitor", bad: false };
}

function renderPools(data) {
  const host = $("pools");
  let up = 0, total = 0, degraded = 0;
  const sample = lastSample();
  const seenPools = new Set();
  for (const p of data.pools) {
    seenPools.add(p.name);
    let card = state.pools.get(p.name);
    if (!card || !card.section.isConnected) {
      const tbody = el("tbody");
      const title = el("span");
      const tag = el("span", { class: "tag muted" });
      const add = el("button", { type: "button", class: "act add", "data-action": "add-member",
        onclick: () => openEditor("member", { pool: p.name, isNew: true }) }, "Add member…");
      const section = el("section", { class: "panel pool", "data-pool": p.name },
        el("h2", {}, title, tag, add),
        el("table", { class: "grid" },
          el("thead", {}, el("tr", {}, ...["Member", "Health", "Last check", "Admin state", "Weight", "Effective", "Active", "Req/s", "Resp. time", "Trend", "Actions"]
            .map((h, i) => el("th", { class: [4, 5, 6, 7, 8].includes(i) ? "num" : "" }, h)))),
          tbody));
      card = { section, tbody, title, tag };
      state.pools.set(p.name, card);
    }
    host.append(card.section);
    const members = p.members.length, upHere = p.members.filter((m) => m.health === "up").length;
    up += upHere; total += members;
    if (upHere < members) degraded++;
    setText(card.title, "Pool " + p.name);
    const el_ = p.elastic;
    setText(card.tag, `${p.algorithm} · ${p.available}/${members} available · ${fmt(p.no_member)} turned away` +
      (el_ ? ` · elastic ${el_.on}: ${Math.round(el_.utilisation * 100)} % (join ${Math.round(el_.join * 100)} %, leave ${Math.round(el_.leave * 100)} %), ${el_.joined}/${el_.standby} standby joined` : ""));
    for (const m of p.members) {
      const key = `m:${p.name}/${m.address}`;
      const rec = row(card.tbody, key, 11, (rec) => {
        rec.tds[0].className = "addr";
        for (const i of [4, 5, 6, 7, 8]) rec.tds[i].className = "num";
        rec.reason = el("span", { class: "reason" });
        rec.tds[2].append(rec.reason);
        rec.canvas = el("canvas", { class: "spark" });
        rec.tds[9].append(rec.canvas);
        const cell = el("div", { class: "actions-cell" });
        rec.buttons = {};
        for (const [act, label] of [["drain", "Drain"], ["enabled", "Enable"], ["disabled", "Disable"], ["weight", "Weight…"]]) {
          const b = el("button", { type: "button", class: "act " + act.replace("enabled", "enable").replace("disabled", "disable"), "data-action": act,
            onclick: () => confirmAction(rec.pool, rec.address, act, rec.weight) }, label);
          rec.buttons[act] = b; cell.append(b);
        }
        cell.append(el("button", { type: "button", class: "act", "data-action": "edit",
          onclick: () => openEditor("member", { pool: rec.pool, address: rec.address }) }, "Edit…"));
        rec.tds[10].append(cell);
      });
      rec.pool = p.name; rec.address = m.address; rec.weight = m.weight;
      const t = rec.tds;
      setText(t[0], m.address + (m.elastic ? ` (standby, ${m.elastic === "joined" ? "joined" : "out"})` : ""));
      pill(t[1], m.health, m.health);
      const reason = memberReason(m);
      setText(rec.reason, reason.text); rec.reason.title = reason.text;
      rec.reason.className = "reason" + (reason.bad ? " bad" : "");
      pill(t[3], m.state === "enabled" && m.effective_state !== m.state ? `enabled (${m.effective_state})` : m.state, m.state);
      setText(t[4], String(m.weight));
      setText(t[5], fmt(m.effective_weight, m.effective_weight % 1 ? 2 : 0) + (m.slow_start && m.slow_start !== "none" && m.slow_start !== "done" ? " ⟳" : ""));
      t[5].title = "slow start: " + m.slow_start;
      setText(t[6], fmt(m.active_connections));
      const s = sample ? sample.members.find((x) => x.pool === p.name && x.address === m.address) : null;
      setText(t[7], s ? fmt(s.requests_per_s || s.connections_per_s) : "–");
      setText(t[8], m.response_time_ms ? m.response_time_ms.toFixed(1) + " ms" : "–");
      spark(rec.canvas, memberTrend(p.name, m.address), m.health === "up" ? "#22c55e" : "#ef4444");
      rec.buttons.drain.disabled = m.state === "drain";
      rec.buttons.enabled.disabled = m.state === "enabled";
      rec.buttons.disabled.disabled = m.state === "disabled";
    }
    prune(card.tbody);
  }
  for (const [name, card] of state.pools) if (!seenPools.has(name)) { card.section.remove(); state.pools.delete(name); }
  if (!data.pools.length) host.replaceChildren(el("section", { class: "panel empty" }, "No pools configured."));
  setText($("t-members"), `${up}/${total}`);
  $("t-members").className = up < total ? "warn" : "good";
  setText($("t-pools"), String(degraded));
  $("t-pools").className = degraded ? "warn" : "good";
}

function renderGslb(data) {
  const panel = $("gslb-panel");
  if (!data || !data.sites || !data.sites.length) { panel.classList.add("hidden"); return; }
  panel.classList.remove("hidden");
  const tbody = $("gslb").tBodies[0];
  for (const s of data.sites) {
    const rec = row(tbody, "site:" + s.name, 6, (rec) => { rec.tds[4].className = "num"; rec.tds[5].className = "addr"; });
    const t = rec.tds;
    setText(t[0], s.name + (s.local ? " (local)" : ""));
    pill(t[1], s.health, s.health); pill(t[2], s.state, s.state);
    setText(t[3], (s.regions || []).join(", ") || "–"); setText(t[4], String(s.weight));
    setText(t[5], (s.addresses || []).map((a) => `${a.address} ${a.health}`).join(", "));
  }
  prune(tbody);
  renderShares(data.names || []);
}

// Shown only when this node runs VRRP ([ha]); the API answers 404 otherwise.
function renderHa(data) {
  const panel = $("ha-panel");
  if (!data || !data.role) { panel.classList.add("hidden"); return; }
  panel.classList.remove("hidden");
  const tbody = $("ha").tBodies[0];
  const rec = row(tbody, "ha", 9, (rec) => { rec.tds[4].className = "num"; rec.tds[7].className = "addr"; });
  const t = rec.tds;
  setText(t[0], data.node || "–");
  pill(t[1], data.role + (data.maintenance ? " (maintenance)" : ""), data.role === "master" ? "up" : data.role === "backup" ? "drain" : "down");
  setText(t[2], String(data.vrid)); setText(t[3], data.interface || "–");
  setText(t[4], data.priority === data.configured_priority ? String(data.priority) : `${data.priority} (of ${data.configured_priority})`);
  pill(t[5], data.healthy ? "yes" : "no", data.healthy ? "up" : "down");
  setText(t[6], data.peer ? `${data.peer.address} (priority ${data.peer.priority})` : "–");
  setText(t[7], (data.vips || []).join(", ") || "–");
  const lt = data.last_transition;
  setText(t[8], lt ? `${lt.from} → ${lt.to} (${lt.reason}) ${ago(lt.at)}` : "–");
  setText($("ha-tag"), `${data.transitions || 0} transitions`);
  renderConfigSync(data.config_sync);
}

// [ha] config_sync: where the two nodes' configurations stand; a divergence waits for a choice.
function renderConfigSync(cs) {
  const box = $("config-sync");
  box.classList.toggle("hidden", !cs);
  if (!cs) return;
  const seq = (c) => (c ? `#${c.seq} from ${c.origin}` : "–");
  const words = { in_sync: "in sync", behind: cs.behind === "local" ? "this node is behind" : "the peer is behind",
    diverged: "diverged: both nodes changed", unknown: "waiting for the peer" };
  pill($("config-sync-state"), words[cs.state] || cs.state, cs.state === "in_sync" ? "up" : cs.state === "diverged" ? "down" : "drain");
  setText($("config-sync-versions"), `this node ${seq(cs.local)} · peer ${seq(cs.peer)}` + (cs.refused ? ` · refused here: ${cs.refused}` : ""));
  $("config-sync-actions").classList.toggle("hidden", cs.state !== "diverged");
}

async function adoptConfig(side) {
  const what = side === "local" ? "Keep this node's configuration (the peer takes it)?" : "Take the peer's configuration here?";
  if (!window.confirm(what)) return;
  try {
    await api("PUT", "/api/v1/ha/config_sync", { adopt: side });
    banner("Configuration divergence settled.", true);
  } catch (e) {
    banner("Could not settle the divergence: " + e.message);
  }
  refresh();
}

// Shown only when link or gateway pools are configured.
function renderLinks(data) {
  const panel = $("links-panel");
  if (!data || !data.links || !data.links.length) { panel.classList.add("hidden"); return; }
  panel.classList.remove("hidden");
  const tbody = $("links").tBodies[0];
  for (const l of data.links) {
    const group = l.outbound || l.gateway_service || "";
    const rec = row(tbody, "link:" + group + ":" + l.name, 13, (rec) => {
      for (const i of [7, 8, 9, 10, 11]) rec.tds[i].className = "num";
      rec.tds[4].className = "addr";
    });
    const t = rec.tds;
    setText(t[0], l.name); setText(t[1], l.kind); setText(t[2], group);
    setText(t[3], l.interface || "–"); setText(t[4], l.gateway || "–");
    pill(t[5], l.health, l.health); pill(t[6], l.state, l.state);
    setText(t[7], String(l.weight)); setText(t[8], fmt(l.share));
    setText(t[9], fmt(l.rate_up_bps)); setText(t[10], fmt(l.rate_down_bps));
    setText(t[11], l.flows_active === null || l.flows_active === undefined ? fmt(l.flows_total) : `${fmt(l.flows_active)} / ${fmt(l.flows_total)}`);
    setText(t[12], (l.targets || []).map((x) => `${x.target || x.monitor}: ${x.rtt_ms === null ? "–" : x.rtt_ms + " ms"}${x.loss === null ? "" : ", " + Math.round(x.loss * 100) + " % loss"}`).join("; ") || "–");
  }
  prune(tbody);
}

function renderFilters(data) {
  const panel = $("filters-panel");
  if (!data || !data.filters || !data.filters.length) { panel.classList.add("hidden"); return; }
  panel.classList.remove("hidden");
  const tbody = $("filters").tBodies[0];
  for (const f of data.filters) {
    const rec = row(tbody, "filter:" + f.service + ":" + f.filter, 8, (rec) => {
      for (const i of [3, 4, 5, 6, 7]) rec.tds[i].className = "num";
      rec.tds[1].className = "addr";
    });
    const t = rec.tds;
    setText(t[0], f.service); setText(t[1], f.filter);
    pill(t[2], f.disabled ? "disabled" : "running", f.disabled ? "down" : "up");
    setText(t[3], fmt(f.calls)); setText(t[4], fmt(f.local_replies)); setText(t[5], fmt(f.http_calls));
    setText(t[6], `${fmt(f.budget_exceeded)} / ${fmt(f.memory_exceeded)} / ${fmt(f.traps)}`);
    setText(t[7], fmt(f.restarts));
  }
  prune(tbody);
}

// One bar per region: each site's share of the answers, in the site's colour.
function renderShares(names) {
  const siteColor = new Map();
  const color = (site) => {
    if (!siteColor.has(site)) siteColor.set(site, COLORS[siteColor.size % COLORS.length]);
    return siteColor.get(site);
  };
  const rows = names.map((n) => {
    const regions = Object.entries(n.shares || {});
    const cell = el("div", { class: "shares" }, ...regions.map(([region, sites]) => {
      const bar = el("div", { class: "share-bar" });
      const text = [];
      for (const [site, share] of Object.entries(sites)) {
        const seg = el("span", { title: `${site}: ${(share * 100).toFixed(1)} %` });
        seg.style.width = (share * 100).toFixed(2) + "%";
        seg.style.background = color(site);
        bar.append(seg);
        text.push(`${site} ${(share * 100).toFixed(0)} %`);
      }
      return el("div", { class: "share-row" }, el("span", { class: "region" }, region === "*" ? "other" : region), bar, el("span", {}, text.join(" · ") || "no site"));
    }));
    return el("tr", {}, el("td", { class: "addr" }, n.fqdn), el("td", {}, n.algorithm),
      el("td", { class: "num" }, fmt(n.queries)), el("td", { class: "num" }, fmt(n.fallbacks)), el("td", {}, cell));
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colspan: "5" }, "No GSLB names.")));
  $("gslb-names").tBodies[0].replaceChildren(...rows);
}

function renderAudit(data) {
  const tbody = $("audit").tBodies[0];
  const entries = (data.entries || []).slice(0, 25);
  const rows = entries.map((e) => el("tr", {},
    el("td", { title: new Date(e.at * 1000).toISOString() }, ago(e.at)),
    el("td", { class: "addr" }, e.from),
    el("td", { class: "addr" }, `${e.method} ${e.path}`),
    el("td", { class: "addr" }, e.body),
    el("td", { class: "num" }, el("span", { class: "pill " + (e.status < 300 ? "up" : "down") }, String(e.status)))));
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colspan: "5" }, "No changes yet.")));
  tbody.replaceChildren(...rows);
}

function renderAlerts(data) {
  const tbody = $("alerts").tBodies[0];
  const firing = data.firing || [];
  const pending = (data.pending || []).length;
  const rules = Object.keys(data.delivery || {}).length;
  let failed = 0;
  for (const r of Object.values(data.delivery || {})) {
    failed += r.dropped || 0;
    for (const s of Object.values(r.sinks || {})) failed += s.failed || 0;
  }
  setText($("alerts-tag"), rules
    ? `${firing.length} firing · ${pending} pending · ${rules} rule${rules === 1 ? "" : "s"}` + (failed ? ` · ${failed} notifications failed` : "")
    : "no [[alert]] rules configured");
  $("alerts-panel").classList.toggle("firing", firing.length > 0);
  const rows = firing.map((a) => el("tr", {},
    el("td", {}, el("span", { class: "pill " + (a.labels.severity === "critical" ? "down" : "drain") }, a.labels.severity || "alert")),
    el("td", {}, a.labels.alertname || a.event),
    el("td", {}, a.summary),
    el("td", { title: a.since || "" }, a.since ? ago(Date.parse(a.since) / 1000) : "–"),
    el("td", {}, a.rule)));
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colspan: "5" }, rules ? "Nothing firing." : "Alerting is not configured.")));
  tbody.replaceChildren(...rows);
}

function renderCerts(data) {
  const panel = $("certs-panel");
  const certs = (data && data.certificates) || [];
  panel.classList.toggle("hidden", !certs.length);
  $("certs").tBodies[0].replaceChildren(...certs.map((c) => el("tr", {},
    el("td", {}, c.service),
    el("td", { class: "addr" }, c.file),
    el("td", {}, c.not_after.replace("T", " ").replace("Z", " UTC")),
    el("td", { class: "num" }, el("span", { class: "pill " + (c.days_left < 7 ? "down" : c.days_left < 30 ? "drain" : "up") }, c.expired ? "expired" : String(c.days_left))))));
}

// ---- actions --------------------------------------------------------------------------------

let pending = null;

function confirmAction(pool, address, action, weight) {
  const dlg = $("confirm");
  const words = { drain: "Drain", enabled: "Enable", disabled: "Disable", weight: "Set the weight of" };
  const effect = {
    drain: "It takes no new clients; persistent and open connections finish.",
    enabled: "It takes new clients again.",
    disabled: "It takes no new clients, including persistent ones.",
    weight: "The scheduler uses the new weight at once.",
  };
  setText($("confirm-title"), `${words[action]} ${address}?`);
  setText($("confirm-text"), `Pool ${pool}. ${effect[action]}`);
  $("weight-row").classList.toggle("hidden", action !== "weight");
  $("weight-input").value = String(weight);
  $("confirm-ok").className = "primary";
  pending = { pool, address, action };
  dlg.returnValue = "";
  dlg.showModal();
  if (action === "weight") $("weight-input").focus(); else $("confirm-ok").focus();
}

async function runPending() {
  const p = pending; pending = null;
  if (!p) return;
  const base = `/api/v1/pools/${encodeURIComponent(p.pool)}/members/${encodeURIComponent(p.address)}`;
  try {
    if (p.action === "weight") {
      const w = Number($("weight-input").value);
      if (!Number.isInteger(w) || w < 0 || w > 65535) throw new Error("the weight must be an integer from 0 to 65535");
      await api("PUT", base + "/weight", { weight: w });
      banner(`Weight of ${p.address} in ${p.pool} set to ${w}.`, true);
    } else {
      await api("PUT", base + "/state", { state: p.action });
      banner(`${p.address} in ${p.pool} is now ${p.action}.`, true);
    }
    setTimeout(() => { if ($("banner").classList.contains("good")) banner(""); }, 4000);
  } catch (e) {
    banner(`Could not change ${p.address} in ${p.pool}: ${e.message}` + (e.status === 401 ? " (set the admin token, then try again)" : ""));
    // Changes may need a token even where reading does not: ask for it at once.
    if (e.status === 401 && !$("token-dialog").open) $("token-dialog").showModal();
  }
  refresh();
}

// ---- configuration forms: the same objects and keys as the file, through /api/v1/config ----

const enc = encodeURIComponent;
const EDITORS = {
  member: {
    title: (c) => (c.isNew ? `Add a member to pool ${c.pool}` : `Edit member ${c.address} of pool ${c.pool}`),
    path: (c, v) => `/api/v1/config/pools/${enc(c.pool)}/members/${enc(c.isNew ? v.address : c.address)}`,
    fields: [
      { key: "address", label: "Address (ip:port)", type: "text", fixed: true },
      { key: "weight", label: "Weight (0–65535)", type: "number" },
      { key: "max_connections", label: "Max connections (empty: no limit)", type: "number" },
    ],
  },
  service: {
    title: (c) => (c.isNew ? "Add a virtual service" : `Edit virtual service ${c.name}`),
    path: (c, v) => `/api/v1/config/virtual_services/${enc(c.isNew ? v.name : c.name)}`,
    fields: [
      { key: "name", label: "Name", type: "text", fixed: true },
      { key: "protocol", label: "Protocol", type: "select", options: ["http", "https", "tcp", "udp", "message"] },
      { key: "listen", label: "Listen (ip:port, comma-separated)", type: "list" },
      { key: "pool", label: "Pool", type: "select", options: () => [...state.pools.keys()] },
    ],
  },
};

let editing = null;

async function openEditor(kind, ctx) {
  const ed = EDITORS[kind];
  let current = {};
  if (!ctx.isNew) {
    try {
      current = await api("GET", ed.path(ctx, {}));
    } catch (e) {
      banner(`Cannot read the configuration of ${ctx.address || ctx.name}: ${e.message}`);
      return;
    }
  }
  const host = $("edit-fields");
  host.replaceChildren();
  for (const f of ed.fields) {
    let input;
    if (f.type === "select") {
      const opts = typeof f.options === "function" ? f.options() : f.options;
      input = el("select", { name: f.key }, ...opts.map((o) => el("option", { value: o }, o)));
    } else {
      input = el("input", { name: f.key, type: f.type === "number" ? "number" : "text", autocomplete: "off" });
    }
    const v = current[f.key];
    if (v !== undefined && v !== null) input.value = Array.isArray(v) ? v.join(", ") : String(v);
    if (f.fixed && !ctx.isNew) input.disabled = true;
    host.append(el("label", {}, f.label, input));
  }
  setText($("edit-title"), ed.title(ctx));
  setText($("edit-errors"), "");
  editing = { kind, ctx, current };
  $("edit-dialog").showModal();
  host.querySelector("input:not([disabled]), select")?.focus();
}

async function saveEditor(ev) {
  ev.preventDefault();
  if (!editing) return;
  const { kind, ctx, current } = editing;
  const ed = EDITORS[kind];
  const body = { ...current };
  const values = {};
  for (const f of ed.fields) {
    const input = $("edit-fields").querySelector(`[name="${f.key}"]`);
    const raw = input.value.trim();
    if (f.fixed && !ctx.isNew) { values[f.key] = current[f.key]; continue; }
    if (raw === "") { delete body[f.key]; continue; }
    if (f.type === "number") {
      const n = Number(raw);
      if (!Number.isInteger(n) || n < 0) { setText($("edit-errors"), `${f.label}: a whole number is expected`); return; }
      body[f.key] = n;
    } else if (f.type === "list") {
      body[f.key] = raw.split(",").map((x) => x.trim()).filter((x) => x);
    } else {
      body[f.key] = raw;
    }
    values[f.key] = body[f.key];
  }
  try {
    await api("PUT", ed.path(ctx, values), body);
  } catch (e) {
    // The configuration's own checks answer: shown in the form, which stays open.
    setText($("edit-errors"), e.message + (e.status === 401 ? " (set the admin token)" : ""));
    return;
  }
  editing = null;
  $("edit-dialog").close();
  banner(ed.title(ctx).replace(/^(Add|Edit)/, (w) => (w === "Add" ? "Added:" : "Saved:")) + ".", true);
  refresh();
}

// ---- refresh loop ---------------------------------------------------------------------------

let timer = null;
let running = false;

async function refresh() {
  if (running) return;
  running = true;
  clearTimeout(timer);
  try {
    const wantCerts = Date.now() - state.certsAt > 30000;
    const [status, pools, hist, audit, gslb, alerts, certs, links, ha, filters] = await Promise.all([
      api("GET", "/api/v1/status"),
      api("GET", "/api/v1/pools"),
      api("GET", "/api/v1/history?member_window=130&since=" + state.lastT),
      api("GET", "/api/v1/audit"),
      state.gslb ? api("GET", "/api/v1/gslb").catch((e) => { if (e.status === 404) state.gslb = false; return null; }) : null,
      api("GET", "/api/v1/alerts"),
      wantCerts ? api("GET", "/api/v1/certificates") : null,
      // Only what the configuration has (as of the last refresh: /api/v1/status says).
      state.links ? api("GET", "/api/v1/links").catch(() => null) : null,
      state.ha ? api("GET", "/api/v1/ha").catch(() => null) : null,
      state.filters ? api("GET", "/api/v1/http/filters").catch(() => null) : null,
    ]);
    state.links = !!(status.configured && status.configured.links);
    state.ha = !!(status.configured && status.configured.ha);
    state.filters = !!(status.configured && status.configured.filters);
    if (certs) { state.certs = certs; state.certsAt = Date.now(); }
    for (const s of hist.samples) state.history.push(s);
    if (hist.samples.length) state.lastT = hist.samples[hist.samples.length - 1].t;
    if (state.history.length > 600) state.history.splice(0, state.history.length - 600);
    setText($("version"), "v" + status.version);
    setText($("generation"), "config generation " + status.generation);
    renderServices(status);
    renderPools(pools);
    renderGslb(gslb);
    renderLinks(links);
    renderHa(ha);
    renderFilters(state.filters ? filters : null);
    renderAudit(audit);
    renderAlerts(alerts);
    renderCerts(state.certs);
    // The window grows with the history kept: 1, 5, then 10 minutes.
    const kept = state.history.length ? Date.now() / 1000 - state.history[0].t : 0;
    const span = kept <= 60 ? 60 : kept <= 300 ? 300 : 600;
    setText($("span"), span < 600 ? `· last ${span / 60} min` : "· last 10 min");
    for (const [id, field] of [["rps", "requests_per_s"], ["active", "connections_active"], ["eps", "errors_per_s"]]) {
      const series = serviceSeries(field);
      drawChart($("c-" + id), series, span);
      legend($("l-" + id), series.map((s) => s.name));
    }
    state.lastOk = Date.now();
    tickLive();
    if (!$("banner").classList.contains("good")) banner("");
    document.body.dataset.loaded = "1";
  } catch (e) {
    if (e.status === 401) {
      banner("The admin API wants a token: press Token (or open /ui/#token=...).");
      if (!$("token-dialog").open && !$("confirm").open) $("token-dialog").showModal();
    } else {
      banner("Cannot reach the admin API: " + e.message);
    }
  } finally {
    running = false;
    timer = setTimeout(refresh, REFRESH_MS);
  }
}

function tickLive() {
  const live = $("live");
  const age = (Date.now() - state.lastOk) / 1000;
  if (!state.lastOk) return;
  live.className = "live " + (age < 3 ? "ok" : "stale");
  setText(live, age < 3 ? "● live" : `stale ${Math.round(age)} s`);
}

document.addEventListener("DOMContentLoaded", () => {
  $("confirm").addEventListener("close", () => {
    if ($("confirm").returnValue === "ok") runPending(); else pending = null;
  });
  $("edit-form").addEventListener("submit", saveEditor);
  $("edit-cancel").addEventListener("click", () => { editing = null; $("edit-dialog").close(); });
  $("vs-add").addEventListener("click", () => openEditor("service", { isNew: true }));
  $("config-keep-local").addEventListener("click", () => adoptConfig("local"));
  $("config-take-peer").addEventListener("click", () => adoptConfig("peer"));
  $("token-button").addEventListener("click", () => { $("token-input").value = ""; $("token-dialog").showModal(); });
  $("token-dialog").addEventListener("close", () => {
    if ($("token-dialog").returnValue === "ok") {
      sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
      refresh();
    }
  });
  setInterval(tickLive, 500);
  refresh();
});
