// Herald dashboard: renders the snapshots of /api/v1/events. No library;
// every value from the broker goes into the page as text, never as HTML.
"use strict";

const $ = (sel) => document.querySelector(sel);
let snap = null;
let showInternal = false;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

function svg(tag, attrs, ...kids) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const k of kids.flat()) if (k) e.append(k);
  return e;
}

function fmtNum(n) {
  if (n === undefined || n === null) return "–";
  if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function fmtAge(t) {
  if (!t) return "–";
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (s < 60) return Math.floor(s) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function shortID(id) {
  id = id || "";
  return id.length > 14 ? "…" + id.slice(-12) : id;
}

function fmtLate(sec) {
  if (sec < 0) return "over 60 s";
  return sec < 1 ? Math.round(sec * 1000) + " ms" : sec + " s";
}

function empty(...content) { return el("div", { class: "empty" }, ...content); }

// ---- sparklines and charts ------------------------------------------------

function spark(values) {
  const w = 120, h = 26;
  const vs = values && values.length ? values : [0];
  const hi = Math.max(1, ...vs);
  const step = vs.length > 1 ? w / (vs.length - 1) : w;
  const pts = vs.map((v, i) => `${(i * step).toFixed(1)},${(h - 2 - (v / hi) * (h - 4)).toFixed(1)}`).join(" ");
  return svg("svg", { class: "spark", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none", role: "img", "aria-label": "messages in per second" },
    svg("polyline", { points: vs.length > 1 ? pts : `0,${h - 2} ${w},${h - 2}` }));
}

const colors = ["#3559c7", "#d1343b", "#1f9d55", "#c27c0e", "#7b3fc7", "#0e8fa3", "#a33f6b", "#5b6b2f"];

function lagChart(history) {
  const w = 600, h = 160, pad = 28;
  const parts = new Set();
  for (const s of history) for (const p of Object.keys(s.by_partition || {})) parts.add(p);
  const keys = [...parts].sort((a, b) => a - b);
  let hi = 1;
  for (const s of history) for (const k of keys) hi = Math.max(hi, (s.by_partition || {})[k] || 0);
  const n = history.length;
  const x = (i) => pad + (n > 1 ? (i * (w - pad - 6)) / (n - 1) : 0);
  const y = (v) => h - 16 - (v / hi) * (h - 30);
  const lines = keys.slice(0, colors.length).map((k, ci) => svg("polyline", {
    stroke: colors[ci],
    points: history.map((s, i) => `${x(i).toFixed(1)},${y((s.by_partition || {})[k] || 0).toFixed(1)}`).join(" "),
  }));
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none", role: "img", "aria-label": "lag per partition over time" },
    svg("text", { x: 2, y: 12 }, document.createTextNode(fmtNum(hi))),
    svg("text", { x: 2, y: h - 16 }, document.createTextNode("0")),
    svg("text", { x: pad, y: h - 3 }, document.createTextNode(n > 1 ? `last ${Math.round((new Date(history[n - 1].at) - new Date(history[0].at)) / 1000)} s` : "collecting…")),
    ...lines);
  const legend = el("div", { class: "legend" }, keys.slice(0, colors.length).map((k, ci) => {
    const s = el("span", { text: "partition " + k });
    s.style.setProperty("--c", colors[ci]);
    return s;
  }));
  return el("div", {}, chart, legend);
}

// ---- views --------------------------------------------------------------

function renderHeader(s) {
  $("#viewof").textContent = `view of node ${s.cluster.view_of} · ${s.cluster.mode}`;
  $("#updated").textContent = "updated " + new Date(s.at).toLocaleTimeString();
  $("#updated").dataset.at = s.at;
  $("#readonly").hidden = !s.read_only;
  const stale = $("#stale");
  stale.hidden = !s.cluster.stale;
  stale.textContent = s.cluster.stale || "";
}

function renderAlerts(s) {
  const box = $("#alerts");
  const items = (s.alerts || []).map((a) => el("div", { class: "alert " + a.severity, "data-kind": a.kind, "data-subject": a.subject },
    el("span", { class: "kind", text: a.kind.replaceAll("_", " ") }), a.message));
  for (const e of s.errors || []) items.push(el("div", { class: "alert", "data-kind": "read_error" }, el("span", { class: "kind", text: "could not read" }), e));
  box.replaceChildren(...items);
}

function renderNodes(s) {
  const cards = s.cluster.members.map((m) => el("div", { class: "card", "data-node": m.node_id, "data-state": m.state },
    el("h3", {}, el("span", { text: `node ${m.node_id}` + (m.self ? " (this one)" : "") }), el("span", { class: "state " + m.state, text: m.state })),
    el("dl", { class: "kv" },
      el("dt", { text: "address" }), el("dd", { text: m.address || "–" }),
      el("dt", { text: "rack" }), el("dd", { text: m.rack || "–" }),
      el("dt", { text: "version" }), el("dd", { text: m.version || "–" }),
      el("dt", { text: "uptime" }), el("dd", { text: m.state === "alive" || m.state === "suspect" ? fmtAge(m.started_at) : "–" }),
      el("dt", { text: m.state + " for" }), el("dd", { text: fmtAge(m.since) }),
      el("dt", { text: "leads" }), el("dd", { class: "leads", text: m.leads }),
      el("dt", { text: "follows" }), el("dd", { class: "follows", text: m.follows }),
      el("dt", { text: "controller" }), el("dd", { text: (m.roles || []).map((r) => r.replace("controller-", "")).join(", ") || "–" })),
    m.note ? el("p", { class: "note", text: m.note }) : null));
  $("#nodes").replaceChildren(...(cards.length ? cards : [empty("no members known yet")]));
}

function renderTopics(s) {
  const topics = s.topics.filter((t) => showInternal || !t.internal);
  if (!topics.length) {
    $("#topic-list").replaceChildren(empty("No topics yet: create one with ", el("code", { text: "herald topic create orders --partitions 3" }), "."));
    return;
  }
  const rows = topics.map((t) => el("tr", { "data-topic": t.name },
    el("td", {}, el("strong", { text: t.name }), t.under_replicated ? el("div", { class: "pill warn", text: `${t.under_replicated} under-replicated` }) : null,
      t.offline ? el("div", { class: "pill bad", text: `${t.offline} offline` }) : null),
    el("td", { class: "num", text: t.partitions }),
    el("td", { class: "num", text: t.replication }),
    el("td", { class: "num", text: fmtNum(t.messages) }),
    el("td", { class: "num", text: fmtBytes(t.size_bytes) }),
    el("td", { class: "num", text: fmtNum(t.msgs_in_per_sec) + "/s" }),
    el("td", { class: "num", text: fmtBytes(t.bytes_out_per_sec) + "/s" }),
    el("td", {}, spark(sumHistories(t.partition_list))),
    el("td", {}, el("div", { class: "grid" }, (t.partition_list || []).map((p) => el(movable(s, t) ? "button" : "div", {
      class: "part" + (p.offline ? " offline" : p.under_replicated ? " under" : ""), "data-partition": `${t.name}/${p.id}`, "data-leader": p.leader,
      title: `replicas ${p.replicas.join(",")}; in sync ${p.in_sync_replicas.join(",") || "none"} (${p.in_sync_from === "leader" ? "from its leader" : "live nodes: its leader did not answer"}); high watermark ${p.high_watermark}` + (movable(s, t) ? "; click to move a replica" : ""),
      onclick: movable(s, t) ? () => confirmMove(s, t, p) : undefined,
    }, el("span", { class: "pid", text: "p" + p.id }), el("span", { class: "leader", text: p.leader ? "L" + p.leader : "no leader" }),
      el("span", { class: "muted", text: p.replicas.join(" ") }))))),
    el("td", {}, t.internal ? null : el("button", { class: "danger", disabled: s.read_only, "data-action": "delete-topic", onclick: () => confirmDelete(t.name) }, "Delete"))));
  $("#topic-list").replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ["topic", "partitions", "RF", "messages", "size", "in", "out", "in, last 2 min", "leaders and replicas", ""].map((h, i) =>
      el("th", { class: i >= 1 && i <= 6 ? "num" : undefined, text: h })))),
    el("tbody", {}, rows)));
}

function sumHistories(parts) {
  const out = [];
  for (const p of parts || []) {
    const h = p.msgs_in_history || [];
    const off = out.length - h.length;
    if (off < 0) { out.unshift(...new Array(-off).fill(0)); }
    const base = Math.max(0, out.length - h.length);
    h.forEach((v, i) => { out[base + i] += v; });
  }
  return out;
}

function renderGroups(s) {
  if (!s.groups.length) {
    $("#group-list").replaceChildren(empty("No consumer groups yet: start one with ", el("code", { text: "herald consume --topic orders --group billing" }), "."));
    return;
  }
  const items = s.groups.map((g) => {
    const info = g.info || {};
    const members = (info.members || []).map((m) => el("tr", {},
      el("td", { text: m.name || shortID(m.member_id) }), el("td", { text: m.address }),
      el("td", { class: "num", text: m.credits }), el("td", { class: "num", text: m.in_flight }),
      el("td", { text: (m.breaker || "BREAKER_CLOSED").replace("BREAKER_", "").toLowerCase() }),
      el("td", { text: (m.partitions || []).join(", ") || "–" })));
    const parts = (info.partitions || []).map((p) => el("tr", { "data-group-partition": `${g.name}/${p.partition}` },
      el("td", { text: p.partition + (p.subscriber ? " · " + p.subscriber : "") }), el("td", { class: "num", text: p.high_watermark }),
      el("td", { class: "num", text: p.ack_floor }), el("td", { class: "num lag", text: p.lag })));
    return el("div", { class: "group", "data-group": g.name, "data-lag": g.lag },
      el("h3", {}, el("span", { text: g.name }), el("span", { class: "pill", text: g.mode }), el("span", { class: "pill", text: "topic " + g.topic }),
        el("span", { class: "pill" + (g.lag_growing ? " warn" : ""), text: `lag ${fmtNum(g.lag)}` + (g.lag_growing ? " ↑" : "") }),
        el("span", { class: "pill" + (g.breaker !== "closed" ? " bad" : ""), text: "breaker " + g.breaker.replace("_", "-") }),
        g.dlq ? el("span", { class: "pill" + (g.dlq_depth ? " warn" : ""), text: `DLQ ${g.dlq}: ${fmtNum(g.dlq_depth)}` }) : null,
        el("span", { class: "spacer" }),
        g.dlq_depth > 0 ? el("button", { disabled: s.read_only, "data-action": "redrive-dlq", onclick: () => confirmRedrive(g) }, "Redrive DLQ…") : null,
        el("button", { disabled: s.read_only, "data-action": "reset-group", onclick: () => confirmReset(g.name) }, "Reset…")),
      el("div", { class: "cols" },
        el("div", {},
          members.length ? el("table", {}, el("thead", {}, el("tr", {}, ["member", "address", "credits", "in flight", "breaker", "partitions"].map((h, i) => el("th", { class: i === 2 || i === 3 ? "num" : undefined, text: h })))), el("tbody", {}, members))
            : empty("No members connected."),
          el("table", {}, el("thead", {}, el("tr", {}, ["partition", "high watermark", "done up to", "lag"].map((h, i) => el("th", { class: i ? "num" : undefined, text: h })))), el("tbody", {}, parts))),
        lagChart(g.lag_history || [])));
  });
  $("#group-list").replaceChildren(...items);
}

function renderScheduler(s) {
  const sc = s.scheduler;
  if (!sc) {
    $("#sched").replaceChildren(empty("The scheduler could not be read from this node."));
    return;
  }
  const late = sc.lateness;
  const fired = late && late.fired > 0;
  if (!sc.pending && !sc.halves_pending && !sc.transactions && !fired) {
    $("#sched").replaceChildren(empty("Nothing scheduled and no transactions open: delay a message with ", el("code", { text: "herald produce --topic orders --delay 10m" }), "."));
    return;
  }
  const b = sc.buckets || {};
  $("#sched").replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ["delayed batches pending", "overdue", "within 1 min", "1 h", "1 d", "later", "half messages pending", "open transactions"].map((h) => el("th", { class: "num", text: h })))),
    el("tbody", {}, el("tr", {}, [sc.pending, b.overdue, b["1m"], b["1h"], b["1d"], b.later, sc.halves_pending, sc.transactions].map((v) => el("td", { class: "num", text: fmtNum(v || 0) }))))),
    el("p", { class: "muted", id: "lateness" }, fired
      ? `Fired in the last ${Math.round(late.window_seconds)} s: ${fmtNum(late.fired)}; lateness p50 ≤ ${fmtLate(late.p50_seconds)}, p99 ≤ ${fmtLate(late.p99_seconds)}.`
      : (sc.lateness_note || "Nothing fired in the last minute.")));
}

function render(s) {
  snap = s;
  renderHeader(s);
  renderAlerts(s);
  renderNodes(s);
  renderTopics(s);
  renderGroups(s);
  renderScheduler(s);
}

// ---- actions ----------------------------------------------------------------

async function call(method, path, body) {
  const headers = { "X-Herald-Action": "1" };
  if (body) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(j.error ? `${j.error.code}: ${j.error.message}` : `HTTP ${r.status}`);
  return j;
}

function ask(text, extra, run) {
  const d = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-extra").replaceChildren(...extra);
  $("#confirm-error").textContent = "";
  const ok = $("#confirm-ok");
  const handler = async (ev) => {
    ev.preventDefault();
    try {
      await run();
      d.close();
    } catch (e) {
      $("#confirm-error").textContent = e.message;
    }
  };
  ok.onclick = handler;
  d.showModal();
}

function confirmDelete(name) {
  const input = el("input", { id: "confirm-name", placeholder: name, autocomplete: "off" });
  ask(`Delete topic "${name}" and every message in it? Type its name to confirm.`, [input],
    () => call("DELETE", `/api/v1/topics/${encodeURIComponent(name)}?confirm=${encodeURIComponent(input.value)}`));
}

// movable: a replica of t's partitions may be moved from the page (a
// cluster, not read-only, some node without a replica).
function movable(s, t) {
  return s.cluster.mode === "cluster" && !s.read_only && !t.internal && s.cluster.members.length > t.replication;
}

function confirmMove(s, t, p) {
  const from = el("select", { id: "confirm-from" }, p.replicas.map((id) => el("option", { value: id, text: `node ${id}` })));
  const to = el("select", { id: "confirm-to-node" }, s.cluster.members.filter((m) => m.state === "alive" && !p.replicas.includes(m.node_id))
    .map((m) => el("option", { value: m.node_id, text: `node ${m.node_id}` })));
  ask(`Move a replica of ${t.name}/${p.id}? Its data is copied to the new node, which then replaces the old one.`,
    [el("label", { text: "from " }), from, el("label", { text: " to " }), to],
    () => call("POST", `/api/v1/topics/${encodeURIComponent(t.name)}/partitions/${p.id}/move`, { from: Number(from.value), to: Number(to.value) }));
}

function confirmRedrive(g) {
  const filter = el("input", { id: "confirm-filter", placeholder: "optional SQL filter, e.g. reason LIKE 'timeout%'", autocomplete: "off" });
  ask(`Send the ${g.dlq_depth} dead letters of ${g.dlq} back to ${g.topic}? The dead-letter topic is not changed.`, [filter], async () => {
    const r = await call("POST", `/api/v1/groups/${encodeURIComponent(g.name)}/dlq/redrive`, filter.value ? { filter: filter.value } : {});
    if (r.failed > 0) throw new Error(`${r.redriven} redriven, ${r.failed} failed: ${r.failures.join("; ")}`);
  });
}

function confirmReset(name) {
  const sel = el("select", { id: "confirm-to" }, el("option", { value: "earliest", text: "earliest (replay everything)" }), el("option", { value: "latest", text: "latest (skip the backlog)" }));
  ask(`Move group "${name}" to a new position? Members must be stopped first.`, [sel],
    () => call("POST", `/api/v1/groups/${encodeURIComponent(name)}/reset`, { to: sel.value }));
}

// ---- the stream ------------------------------------------------------------

function connect() {
  const conn = $("#conn");
  const es = new EventSource("/api/v1/events");
  es.addEventListener("snapshot", (ev) => {
    conn.dataset.state = "live";
    conn.textContent = "live";
    render(JSON.parse(ev.data));
  });
  es.addEventListener("error", (ev) => {
    if (ev.data) {
      try { const j = JSON.parse(ev.data); conn.textContent = j.error.code; } catch (_) { /* not ours */ }
      return;
    }
    conn.dataset.state = "lost";
    conn.textContent = "reconnecting…";
  });
}

$("#show-internal").addEventListener("change", (ev) => {
  showInternal = ev.target.checked;
  if (snap) renderTopics(snap);
});
connect();
