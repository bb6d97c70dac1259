// The run page: one websocket, a snapshot then deltas, charts redrawn from local state.
// What a live page costs is kept down: it redraws at most once per LIVE_MIN_MS (less often
// when redrawing costs more, so that drawing takes at most REDRAW_SHARE of a core), and then
// only the charts whose data changed and that are on screen (the others once scrolled to);
// while the tab is hidden it draws nothing and tells the server to stop sending, and catches
// up when the tab is shown again.
"use strict";
(() => {
  const RUN = window.PSCTL_RUN;
  const T = window.psctlChartTools;
  const api = (p) => `/api/runs/${RUN}/${p}`;
  const dl = (m) => [["CSV", api(`series/${m}/full.csv`)], ["JSON", api(`series/${m}/full.json`)]];
  const LIVE_MIN_MS = 700, LIVE_MAX_MS = 1500, REDRAW_SHARE = 0.04;
  const grid = document.getElementById("charts");
  const cards = {};
  [["acc", "accuracy"], ["tloss", "test_loss"], ["thr", "throughput"], ["loss", "loss"],
    ["stale_t", "staleness"], ["stale_h", "staleness"], ["breakdown", "wait"],
    ["idle", "idle_fraction"], ["timeline", null], ["elastic", null], ["bytes", "bytes_sent"],
    ["lr", "lr_scale"], ["cpu", null], ["mem", null]]
    .forEach(([id, m]) => { cards[id] = PS.card(grid, id, m ? dl(m) : []); });
  // The time series: smoothing, the log scale and the linked cursor apply to these.
  const SERIES = ["acc", "tloss", "thr", "loss", "stale_t", "idle", "bytes", "lr", "cpu", "mem"];
  // The ElasticBSP card stays hidden until the run has barriers (or is an elastic run).
  cards.elastic.div.parentElement.hidden = true;
  // So does the learning-rate scale card until an iteration has one (runs before schema 5).
  cards.lr.div.parentElement.hidden = true;
  // Process samples are in the page already: their CSV is made here, from what is shown.
  [cards.cpu, cards.mem].forEach((c) => {
    const a = PS.el("a", { href: "#", download: `${RUN.slice(0, 8)}-process-samples.csv`, class: "proc-csv" }, "CSV");
    a.addEventListener("click", () => { a.href = processCsv(); });
    c.span.parentElement.appendChild(a);
  });
  const S = { records: new Map(), evals: [], events: [], syncs: new Map(), stale: new Map(),
    last: [], timeline: [], summary: null, origin: 0, width: 1, total: 0, f: {},
    procs: new Map(), procWidth: 0, reason: null, simulated: false, stored: null };
  // A version per kind of data: a chart is redrawn only when one it draws from has changed.
  const V = { records: 0, evals: 0, events: 0, syncs: 0, stale: 0, timeline: 0, procs: 0,
    tools: 0, size: 0 };
  const bump = (...kinds) => kinds.forEach((k) => { V[k] += 1; });
  const probe = window.__psctl = { firstPaint: null, renders: [], latestT: null, messages: 0,
    sockets: 0, badges: [], draws: 0, skipped: 0, offScreen: [], drawMs: {} };
  const xSel = document.getElementById("x-axis");
  xSel.addEventListener("change", () => schedule(true));
  const tools = T.controls(document.querySelector(".filters"), "run", () => { bump("tools"); schedule(true); });
  const linked = T.attachLinkedCursor([]);
  let resized = null;
  window.addEventListener("resize", () => {  // fault labels are placed for the chart's size
    clearTimeout(resized);
    resized = setTimeout(() => { bump("size"); schedule(true); }, 300);
  });

  // -- which charts are on screen: a live page redraws only those --------------------------
  const onScreen = new Set(), offScreen = new Set();
  const seen = new IntersectionObserver((entries) => {
    let due = false;
    entries.forEach((e) => {
      if (e.isIntersecting) { onScreen.add(e.target); due = due || offScreen.size > 0; }
      else onScreen.delete(e.target);
      if (e.target === cards.timeline.div) sayView();
    });
    if (due) schedule(true);
  });
  // The timeline's raw rows are most of what the server sends: it sends them only while the
  // timeline is in view (and once after the first paint).
  const sayView = () => send({ type: "view", timeline: onScreen.has(cards.timeline.div) });
  Object.values(cards).forEach((c) => seen.observe(c.div));
  const lazy = () => probe.allPainted !== undefined && S.summary.status === "running";
  // Draws chart `id` with draw() unless nothing it shows (`kinds`, the x-axis, the tools, the
  // run's status) changed since it was last drawn; on a live page, only once it is on screen.
  function chart(id, kinds, draw, alsoShownIn) {
    const card = cards[id];
    const key = `${kinds.map((k) => V[k]).join(".")}|${xSel.value}|${V.tools}|${V.size}|${S.summary.status}|${plotly}`;
    if (card.key === key) { probe.skipped += 1; return; }
    // Out of view, a chart already showing data waits; its first data is drawn at once.
    const shown = [id, ...(alsoShownIn || [])].some((c) => onScreen.has(cards[c].div));
    if (lazy() && !shown && card.div.dataset.empty === "0") { offScreen.add(id); probe.offScreen = [...offScreen]; return; }
    offScreen.delete(id); probe.offScreen = [...offScreen];
    card.key = key;
    probe.draws += 1;
    const t0 = performance.now();
    draw();
    probe.drawMs[id] = (probe.drawMs[id] || 0) + performance.now() - t0;
  }
  // Smoothing and the log scale, as chosen, on a time series; and its linked cursor.
  function styled(traces, layout) {
    const st = tools.state();
    return [T.smoothTraces(traces, st.smoothing), st.log ? T.logScale(layout, true) : layout];
  }
  function drawSeries(id, traces, layout, xKind) {
    const [t, l] = styled(withGaps(traces, xKind), withBands(layout, xKind));
    PS.draw(cards[id].div, t, l);
    cards[id].div.dataset.xKind = xKind;
    if (plotly === "ready") linked.add(cards[id].div);
  }
  // Time axes count seconds of training from the first iteration (start-up is before 0;
  // PS.trainingS, the clock every view reads), and a resumed run's downtime is left out: its
  // lines break there, a labelled line marks it (on wall time, a band spans it).
  const TS = (t) => PS.trainingS(S.clock, t, S.origin);
  const X = (mode, t, it) => PS.x(mode, t, S.clock, it, S.origin);
  const timeKinds = new Set(["elapsed", "wall"]);
  const asSeconds = (v) => v instanceof Date ? v.getTime() / 1000 : v;
  const downSpans = () => (S.clock && S.clock.downtime) || [];
  function spansIn(xKind) {
    return downSpans().map((d) => xKind === "wall" ? [d.start, d.end] : [TS(d.start), TS(d.start)]);
  }
  function withGaps(traces, xKind) {
    const spans = timeKinds.has(xKind) ? spansIn(xKind) : [];
    if (!spans.length) return traces;
    const cut = (a, b) => spans.some(([s, e]) => a <= s && b >= e);
    return traces.map((t) => {
      if (!Array.isArray(t.x) || !Array.isArray(t.y) || t.type === "bar") return t;
      const x = [], y = [];
      t.x.forEach((xv, i) => {
        if (i > 0 && cut(asSeconds(t.x[i - 1]), asSeconds(xv))) { x.push(t.x[i - 1]); y.push(null); }
        x.push(xv); y.push(t.y[i]);
      });
      return Object.assign({}, t, { x, y, connectgaps: false });
    });
  }
  function withBands(layout, xKind) {
    if (!timeKinds.has(xKind) || !S.clock) return layout;
    const at = (v) => xKind === "wall" ? new Date(v * 1000) : v;
    const band = (a, b, color, text) => ({ type: "rect", name: "band", xref: "x", yref: "paper", x0: at(a), x1: at(b),
      y0: 0, y1: 1, fillcolor: color, opacity: 0.12, line: { width: 0 }, layer: "below",
      label: { text, font: { size: 10, color: "#555" }, textposition: "top center" } });
    const shapes = xKind === "wall" ? spansIn(xKind).map(([a, b]) => band(a, b, "#888", "down"))
      : downSpans().map((d) => ({ type: "line", name: "down", xref: "x", yref: "paper", x0: TS(d.start), x1: TS(d.start),
        y0: 0, y1: 1, line: { color: "#888", width: 2 }, layer: "below",
        label: { text: `down ${PS.fmtS(d.end - d.start)}`, font: { size: 10, color: "#555" }, textposition: "end" } }));
    if (S.clock.startup_s && xKind === "elapsed") shapes.push(band(-S.clock.startup_s, 0, "#4a90d9", "start-up"));
    if (!shapes.length) return layout;
    return Object.assign({}, layout, { shapes: [...(layout.shapes || []), ...shapes] });
  }
  // The page's layout: on a simulated run the time axes say that their time is virtual.
  function layoutOf(title, mode, yTitle, extra) {
    const l = PS.layout(title, mode, yTitle, extra);
    if (S.simulated && (mode === "elapsed" || mode === "wall") && !(extra && extra.xaxis)) {
      l.xaxis = Object.assign({}, l.xaxis, { title: { text: `virtual ${PS.xTitle[mode]}` } });
    }
    return l;
  }

  function applySnapshot(m) {
    S.f = Object.fromEntries(m.record_fields.map((n, i) => [n, i]));
    S.records = new Map(); S.syncs = new Map(); S.stale = new Map();
    S.origin = m.origin; S.width = m.width; S.evals = m.evaluations; S.events = m.events;
    S.clock = m.clock;
    m.records.forEach((r) => S.records.set(r[0] + ":" + r[1], r));
    m.syncs.forEach((s) => S.syncs.set(s.sync_index, s));
    Object.assign(S, { last: m.last, timeline: m.timeline, summary: m.summary, total: m.total_rows,
      timelineWindow: m.timeline_window_s, timelineLimit: m.timeline_limit });
    document.getElementById("config").textContent = JSON.stringify(m.config, null, 2);
    document.getElementById("run-title").textContent = `${m.summary.name} (${m.summary.id.slice(0, 8)})`;
    S.reason = m.reason;
    S.stored = m.stored || null;
    if (m.reason) document.getElementById("run-summary").dataset.reason = m.reason;
    const cluster = (m.config && m.config.cluster) || {};
    S.simulated = cluster.backend === "sim" || m.events.some((e) => e.kind === "simulated");
    bump("records", "evals", "events", "syncs", "stale", "timeline");
  }

  function applyDelta(m) {
    S.summary = m.summary;
    if (m.clock) { S.clock = m.clock; bump("records", "evals", "events"); }
    if (m.stored !== undefined) S.stored = m.stored;  // a server's server_stats arrived
    if (m.records) {
      for (const key of [...S.records.keys()]) if (S.records.get(key)[1] >= m.from_bucket) S.records.delete(key);
      m.records.forEach((r) => S.records.set(r[0] + ":" + r[1], r));
      S.total = m.total_rows; S.last = m.last;
      m.staleness.forEach(([w, s, n]) => S.stale.set(w + ":" + s, (S.stale.get(w + ":" + s) || 0) + n));
      bump("records", "stale");
    }
    if (m.timeline) { S.timeline = m.timeline; bump("timeline"); }
    if (m.evaluations && m.evaluations.length) { S.evals = S.evals.concat(m.evaluations); bump("evals"); }
    if (m.events && m.events.length) {
      S.events = S.events.concat(m.events); bump("events");
      if (m.events.some((e) => e.kind === "simulated")) S.simulated = true;
    }
    if (m.syncs) { m.syncs.forEach((s) => S.syncs.set(s.sync_index, s)); bump("syncs"); }
    if (m.process_samples && m.process_samples.length) addSamples(m.process_samples);
  }

  // -- per-process samples: [role, rank, at, cpu %, rss bytes, pss bytes or null], one series
  // per process. PSS is read for a few processes per sample in turn: most rows of a large run
  // have none, and its line joins the readings there are.
  const PROC_MAX = 1200;  // per process; past it, neighbours are averaged (a long live run)
  const ROLE_ORDER = { coordinator: 0, server: 1, worker: 2, evaluator: 3 };
  const procLabel = (role, rank) => role === "worker" || role === "server" ? `${role} ${rank}` : role;
  function addSamples(rows) {
    for (const [role, rank, at, cpu, rss, pss] of rows) {
      const key = role + ":" + rank;
      if (!S.procs.has(key)) S.procs.set(key, { role, rank, at: [], cpu: [], rss: [], pss: [] });
      const p = S.procs.get(key);
      p.at.push(at); p.cpu.push(cpu); p.rss.push(rss); p.pss.push(pss ?? null);
      if (p.at.length > PROC_MAX) thin(p);
    }
    bump("procs");
  }
  function thin(p) {
    const half = (xs, f) => {
      const out = [];
      for (let i = 0; i + 1 < xs.length; i += 2) out.push(f(xs[i], xs[i + 1]));
      if (xs.length % 2) out.push(xs[xs.length - 1]);  // the newest sample stays as it is
      return out;
    };
    const mean = (a, b) => (a + b) / 2;
    const most = (a, b) => a === null ? b : b === null ? a : Math.max(a, b);  // null: not read
    p.at = half(p.at, mean); p.cpu = half(p.cpu, mean); p.rss = half(p.rss, Math.max);
    p.pss = half(p.pss, most);
    S.procThinned = true;
  }
  function processList() {
    return [...S.procs.values()].sort((a, b) => (ROLE_ORDER[a.role] ?? 9) - (ROLE_ORDER[b.role] ?? 9) || a.rank - b.rank);
  }
  let csvUrl = null;
  function processCsv() {
    if (csvUrl) URL.revokeObjectURL(csvUrl);
    const lines = ["role,rank,at,cpu_percent,rss_bytes,pss_bytes"];
    const cell = (v) => v === null ? "" : Math.round(v);
    for (const p of processList()) p.at.forEach((t, i) => lines.push(`${p.role},${p.rank},${t},${p.cpu[i]},${Math.round(p.rss[i])},${cell(p.pss[i])}`));
    csvUrl = URL.createObjectURL(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
    return csvUrl;
  }

  // -- websocket with automatic reconnection -------------------------------------------------
  // The badge says what the socket does: "live" while it is open on a running run, the run's
  // status once it has ended, "reconnecting" only while no socket is open, "paused" while the
  // tab is hidden. Events of a socket that has been replaced are ignored, so a late close of
  // an old one cannot say "reconnecting" while the new one delivers.
  const badge = document.getElementById("live-badge");
  function setBadge(state) {
    if (badge.textContent === state) return;
    badge.textContent = state; badge.className = "badge " + state;
    probe.badges.push([Date.now() / 1000, state]);
    if (probe.badges.length > 100) probe.badges.shift();
  }
  const hidden = () => document.visibilityState === "hidden";
  function badgeState() {
    const ended = S.summary && S.summary.status !== "running";
    if (ended) return S.summary.status;
    if (!socket || socket.readyState !== WebSocket.OPEN) return "reconnecting";
    if (!S.summary) return "connecting";
    return hidden() ? "paused" : "live";
  }
  let retry = 500, socket = null;
  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }
  function connect() {
    // The page's head opened the first socket already (see run.html); reconnections open anew.
    const early = window.__psctlEarly; window.__psctlEarly = null;
    const ws = early ? early.ws : new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/runs/${RUN}`);
    socket = probe.socket = ws;
    probe.sockets += 1;
    probe.connectAt = probe.connectAt || performance.now();
    ws.onopen = () => {
      if (ws !== socket) return;
      if (hidden()) send({ type: "pause" });
      sayView();
      setBadge(badgeState());
    };
    ws.onmessage = (ev) => {
      if (ws !== socket) return;
      const m = JSON.parse(ev.data); probe.messages += 1; retry = 500;
      if (probe.messages === 1) probe.firstMessage = performance.now();
      if (m.type === "snapshot") { applySnapshot(m); ackDue = true; if (hidden()) send({ type: "pause" }); }
      else if (m.type === "delta") applyDelta(m);
      else if (m.type === "staleness") { S.stale = new Map(); m.counts.forEach(([w, s, n]) => S.stale.set(w + ":" + s, n)); bump("stale"); }
      else if (m.type === "timeline") { S.timeline = m.timeline; bump("timeline"); }
      else if (m.type === "processes") { S.procs = new Map(); S.procWidth = m.width_s; S.procThinned = false; addSamples(m.samples); }
      else if (m.type === "error") { document.getElementById("run-summary").textContent = m.message; return; }
      if (!S.summary) return;
      setBadge(badgeState());
      schedule(m.type !== "delta");
    };
    // A run that has ended changes no more: its final status stays the truth while the server
    // is away (stopped after the run, say), so it is not hidden behind "reconnecting".
    ws.onclose = () => {
      if (ws !== socket) return;
      setBadge(badgeState());
      setTimeout(() => { if (ws === socket) connect(); }, retry);
      retry = Math.min(retry * 2, 5000);
    };
    if (early) {
      early.queue.forEach((ev) => ws.onmessage(ev));
      if (ws.readyState === WebSocket.OPEN) ws.onopen();
      else if (ws.readyState === WebSocket.CLOSED) ws.onclose();
    }
  }
  // The server holds back the staleness histogram (a scan of every row) until the first charts
  // are on screen, so that scan does not compete with drawing them.
  let ackDue = false;
  function sayPainted() {
    if (ackDue && socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "painted" }));
    ackDue = false;
  }
  // A hidden tab draws nothing, and the server sends nothing to it: shown again, the server
  // sends everything since (its cursors stayed where they were) and the page draws once.
  document.addEventListener("visibilitychange", () => {
    send({ type: hidden() ? "pause" : "resume" });
    if (S.summary) setBadge(badgeState());
    if (!hidden() && behind) { behind = false; schedule(true); }
  });

  // Redraws: at once for what the user did and for the first messages; for a live run's
  // deltas, no sooner than LIVE_MIN_MS after the last one, or than REDRAW_SHARE of a core
  // allows at what the last redraws cost.
  let pending = false, timer = null, lastDraw = -Infinity, drawCost = 0, behind = false;
  function schedule(urgent) {
    if (hidden() && probe.firstPaint !== null) { behind = true; return; }
    const live = S.summary && S.summary.status === "running" && probe.allPainted !== undefined;
    const gap = Math.min(LIVE_MAX_MS, Math.max(LIVE_MIN_MS, drawCost / REDRAW_SHARE));
    const wait = urgent || !live ? 0 : Math.max(0, lastDraw + gap - performance.now());
    if (pending && !(urgent && timer !== null)) return;
    clearTimeout(timer); timer = null; pending = true;
    const go = () => {
      timer = null;
      requestAnimationFrame(() => {
        pending = false;
        const t0 = performance.now(), measured = lazy();  // what live redraws cost, not the first
        render();
        lastDraw = performance.now();
        if (measured) drawCost = 0.6 * drawCost + 0.4 * (lastDraw - t0);
        probe.drawCostMs = drawCost;
      });
    };
    if (wait > 0) timer = setTimeout(go, wait); else go();
  }

  // -- series from bucket records --------------------------------------------------------------
  function byWorker() {
    const groups = new Map();
    for (const r of S.records.values()) {
      if (!groups.has(r[0])) groups.set(r[0], []);
      groups.get(r[0]).push(r);
    }
    for (const rows of groups.values()) rows.sort((a, b) => a[1] - b[1]);
    return new Map([...groups.entries()].sort((a, b) => a[0] - b[0]));
  }
  const label = (w) => w < 0 ? "all workers" : `worker ${w}`;
  const xOf = (mode, r) => X(mode, r[S.f.t], r[S.f.it]);
  // While the run is live its newest bucket is still filling: its rate would dip at the edge.
  function lineTraces(groups, mode, col, opts) {
    const out = []; let n = 0;
    for (const [w, all] of groups) {
      const rows = S.summary.status === "running" ? all.slice(0, -1) : all;
      if ((opts.only === "all") !== (w < 0)) continue;
      out.push({ type: "scatter", mode: "lines", name: label(w), line: { color: PS.color(w < 0 ? 9 : w), width: w < 0 ? 2.5 : 1.3 },
        x: rows.map((r) => xOf(mode, r)), y: rows.map((r) => r[S.f[col]] * (opts.scale || 1)) });
      n += rows.length;
    }
    return [out, n];
  }
  // Minimum and maximum of each bucket, one after the other: spikes stay visible.
  function envelopeTraces(groups, mode, lo, hi, lastKey) {
    const out = []; let n = 0;
    for (const [w, rows] of groups) {
      if (w < 0) continue;
      const x = [], y = [];
      rows.forEach((r) => { if (r[S.f[lo]] === null) return; const xv = xOf(mode, r); x.push(xv, xv); y.push(r[S.f[lo]], r[S.f[hi]]); });
      const last = S.last.find((p) => p.worker === w);
      if (last && last[lastKey] !== null) { x.push(X(mode, last.ended_at, last.iteration)); y.push(last[lastKey]); }
      out.push({ type: "scatter", mode: "lines", name: label(w), line: { color: PS.color(w), width: 1 }, x, y, meta: { envelope: true } });
      n += x.length;
    }
    return [out, n];
  }

  // Records by worker, sorted: made again only when the records changed.
  let grouped = null, groupedAt = -1;
  function groups() {
    if (groupedAt !== V.records) { grouped = byWorker(); groupedAt = V.records; }
    return grouped;
  }

  function render() {
    const mode = xSel.value, sum = S.summary;
    document.getElementById("run-summary").textContent = `${sum.status} · ${sum.sync} · ${sum.workers} workers × ${sum.servers} servers · ${sum.dataset} · ` +
      `${sum.iterations.toLocaleString()} iterations · best accuracy ${PS.pct(sum.best_accuracy)} · started ${PS.date(sum.started_at)} · `;
    const dur = document.getElementById("run-duration") || document.getElementById("run-summary").appendChild(PS.el("span", { id: "run-duration" }));
    dur.textContent = `duration ${PS.fmtS(sum.duration_s)}`;
    document.getElementById("run-summary").prepend(...(S.simulated ? [PS.el("span", { class: "sim-mark" }, "simulated · ")] : []));
    renderStored(); renderBanner(); renderSimulated(); renderResumed(); renderFaults();
    if (window.psctlRunStatus) window.psctlRunStatus.update(S);
    const ready = plotly === "ready";
    const top = (id, traces, layout) => {
      const card = cards[id];
      if (!ready) { preview(card.div, traces, layout); return; }
      if (card.div.dataset.preview) { card.div.replaceChildren(); delete card.div.dataset.preview; }
      drawSeries(id, traces, layout, mode);
    };
    const ex = (e) => X(mode, e.at, e.step);
    // Events have a time, not an iteration: on the iteration axis they are not marked.
    const marks = (id, traces) => mode === "iteration" ? { shapes: [], annotations: [] }
      : eventMarks(cards[id].div, (at) => X(mode, at, null), -Infinity, traces);
    chart("acc", ["evals", "events"], () => {
      const traces = [{ type: "scatter", mode: "lines+markers", name: "test accuracy", x: S.evals.map(ex), y: S.evals.map((e) => 100 * e.accuracy) }];
      const m = marks("acc", traces);
      cards.acc.div.dataset.faultMarks = String(m.shapes.length);
      top("acc", traces, layoutOf("Test accuracy", mode, "accuracy (%)", { showlegend: false, ...m }));
      PS.setCount(cards.acc, S.evals.length, S.evals.length);
    });
    // Sparse logistic regression records its training objective as the evaluation's loss.
    const objective = sum.dataset === "sparse-synthetic";
    chart("tloss", ["evals", "events"], () => {
      const traces = [{ type: "scatter", mode: "lines+markers", name: objective ? "objective" : "test loss", x: S.evals.map(ex), y: S.evals.map((e) => e.loss) }];
      const m = marks("tloss", traces);
      cards.tloss.div.dataset.faultMarks = String(m.shapes.length);
      top("tloss", traces, layoutOf(objective ? "Training objective" : "Test loss", mode, objective ? "logistic loss + l1 |w|" : "cross-entropy", { showlegend: false, ...m }));
      PS.setCount(cards.tloss, S.evals.length, S.evals.length);
    });
    chart("thr", ["records", "events"], () => {
      const [thrAll, nAll] = lineTraces(groups(), mode, "throughput", { only: "all" });
      const [thrW, nW] = lineTraces(groups(), mode, "throughput", {});
      const traces = thrAll.concat(thrW), m = marks("thr", traces);
      cards.thr.div.dataset.faultMarks = String(m.shapes.length);
      top("thr", traces, layoutOf("Throughput", mode, "samples/s", m));
      PS.setCount(cards.thr, nAll + nW, S.total, "iterations");
    });
    chart("loss", ["records", "events"], () => {
      const [lossT, nLoss] = envelopeTraces(groups(), mode, "loss_min", "loss_max", "loss");
      const m = marks("loss", lossT);
      cards.loss.div.dataset.faultMarks = String(m.shapes.length);
      top("loss", lossT, layoutOf("Training loss (min and max per bucket)", mode, "cross-entropy", m));
      PS.setCount(cards.loss, nLoss, S.total, "iterations");
    });
    // The charts above the fold are drawn first (a preview until plotly.js runs); the rest
    // follow in the next task, so the page is readable before every chart is done.
    if (probe.firstPaint === null) {
      requestAnimationFrame(() => {
        probe.firstPaint = performance.now(); probe.preview = !ready;
        if (ready) probe.plotlyPaint = probe.firstPaint;
        document.body.dataset.painted = "1"; sayPainted();
        setTimeout(ready ? () => renderRest(mode) : loadPlotly, 0);
      });
    } else if (!ready) {
      sayPainted();
    } else if (probe.plotlyPaint === undefined) {
      requestAnimationFrame(() => { probe.plotlyPaint = performance.now(); setTimeout(() => renderRest(mode), 0); });
    } else { sayPainted(); renderRest(mode); }
  }

  // -- plotly.js: fetched by the page's head (preload), run once the preview is on screen -----
  let plotly = "no";  // "no", then "loading", then "ready"
  function loadPlotly() {
    if (plotly !== "no") return;
    plotly = "loading";
    const script = PS.el("script", { src: window.PSCTL_PLOTLY });
    script.onload = () => { plotly = "ready"; if (S.summary) schedule(true); };
    script.onerror = () => { document.getElementById("run-summary").textContent = "plotly.js did not load: reload the page"; };
    document.head.appendChild(script);
  }
  setTimeout(loadPlotly, 1500);  // no snapshot by then (a slow database): wait no longer

  // A static SVG of a line chart (title, axes, ticks, lines) for before plotly.js runs, laid
  // out with PS.layout's margins so that nothing jumps when Plotly.react replaces it.
  function preview(div, traces, layout) {
    const W = div.clientWidth || 560, H = div.clientHeight || 320, m = { l: 58, r: 12, t: 34, b: 48 };
    const xs = [], ys = [];
    traces.forEach((t) => t.x.forEach((x, i) => { const y = t.y[i]; if (y !== null && Number.isFinite(+x) && Number.isFinite(y)) { xs.push(+x); ys.push(y); } }));
    const lo = (a, d) => a.length ? a.reduce((p, v) => Math.min(p, v), Infinity) : d;
    const hi = (a, d) => a.length ? a.reduce((p, v) => Math.max(p, v), -Infinity) : d;
    const x0 = lo(xs, 0), x1 = hi(xs, 1), y0 = Math.min(0, lo(ys, 0)), y1 = hi(ys, 1);
    const sx = (v) => m.l + (v - x0) / ((x1 - x0) || 1) * (W - m.l - m.r);
    const sy = (v) => H - m.b - (v - y0) / ((y1 - y0) || 1) * (H - m.t - m.b);
    const ticks = (a, b) => {
      if (!(b > a)) return [a];
      const raw = (b - a) / 5, p = Math.pow(10, Math.floor(Math.log10(raw)));
      const step = [1, 2, 5, 10].map((k) => k * p).find((k) => k >= raw), out = [];
      for (let v = Math.ceil(a / step) * step; v <= b + step * 1e-9 && out.length < 12; v += step) out.push(v);
      return out;
    };
    const esc = (t) => String(t).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
    const num = (v) => String(Number(v.toPrecision(6)));
    const xl = xSel.value === "wall" ? (v) => PS.date(v / 1000).slice(11) : num;
    const text = (x, y, t, extra) => `<text x="${x}" y="${y}" ${extra || ""}>${esc(t)}</text>`;
    const parts = [text(W * 0.02, 22, layout.title.text, 'font-size="14"')];
    if (!xs.length) {  // nothing to draw: no made-up axes, as PS.draw does once plotly.js runs
      parts.push(text(W / 2, H / 2, "no data", 'text-anchor="middle" font-size="14" fill="#777"'));
      div.innerHTML = `<svg class="preview" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="system-ui, sans-serif" font-size="11" fill="#444">${parts.join("")}</svg>`;
      div.dataset.preview = "1"; div.dataset.empty = "1";
      return;
    }
    ticks(y0, y1).forEach((v) => parts.push(`<line x1="${m.l}" x2="${W - m.r}" y1="${sy(v)}" y2="${sy(v)}" stroke="#eee"/>`,
      text(m.l - 6, sy(v) + 4, num(v), 'text-anchor="end"')));
    ticks(x0, x1).forEach((v) => parts.push(text(sx(v), H - m.b + 16, xl(v), 'text-anchor="middle"')));
    parts.push(text((m.l + W - m.r) / 2, H - 8, layout.xaxis.title.text, 'text-anchor="middle" font-size="13"'),
      text(14, (m.t + H - m.b) / 2, layout.yaxis.title.text, `text-anchor="middle" font-size="13" transform="rotate(-90 14 ${(m.t + H - m.b) / 2})"`));
    traces.forEach((t, i) => {
      const pts = t.x.map((x, k) => t.y[k] === null || !Number.isFinite(+x) ? null : `${sx(+x).toFixed(1)},${sy(t.y[k]).toFixed(1)}`).filter((q) => q);
      const color = (t.line && t.line.color) || PS.color(i), width = (t.line && t.line.width) || 1.5;
      parts.push(`<polyline fill="none" stroke="${color}" stroke-width="${width}" points="${pts.join(" ")}"/>`);
    });
    div.innerHTML = `<svg class="preview" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="system-ui, sans-serif" font-size="11" fill="#444">${parts.join("")}</svg>`;
    div.dataset.preview = "1";
  }

  function renderRest(mode) {
    chart("stale_t", ["records"], () => {
      const [stT, nSt] = envelopeTraces(groups(), mode, "staleness_min", "staleness_max", "staleness");
      drawSeries("stale_t", stT, layoutOf("Staleness over time (min and max per bucket)", mode, "staleness (updates since the pull)"), mode);
      PS.setCount(cards.stale_t, nSt, S.total, "iterations");
    });
    chart("stale_h", ["stale"], renderHistogram);
    chart("breakdown", ["records"], () => renderBreakdown(groups()));
    chart("idle", ["records"], () => {
      const [idleT, nIdle] = lineTraces(groups(), mode, "idle_fraction", { scale: 100 });
      drawSeries("idle", idleT, layoutOf("Idle (wait) fraction per worker", mode, "idle (% of wall time)"), mode);
      PS.setCount(cards.idle, nIdle, S.total, "iterations");
    });
    chart("bytes", ["records"], () => {
      const all = (groups().get(-1) || []).slice(0, S.summary.status === "running" ? -1 : undefined);
      // Push bytes as sent and as dense float32 pushes would have been: apart when a push
      // filter or a narrow wire type saves bytes (runs before schema 5 have neither line).
      // The pull bytes SSP's cache saved: drawn only where some read was answered from it.
      const lines = [["sent_per_s", "sent"], ["received_per_s", "received"], ["pushed_per_s", "pushes sent"],
        ["pushed_dense_per_s", "pushes before filtering"], ["pull_saved_per_s", "pulls the cache saved"]]
        .filter(([c]) => all.some((r) => r[S.f[c]] !== null && r[S.f[c]] !== undefined
          && (c !== "pull_saved_per_s" || r[S.f[c]] > 0)));
      drawSeries("bytes", lines.map(([c, name], i) => ({ type: "scatter", mode: "lines", name,
        line: { color: PS.color(i), dash: i % 2 ? "solid" : "dash", width: i % 2 ? 1.5 : 2.5 }, x: all.map((r) => xOf(mode, r)), y: all.map((r) => r[S.f[c]]) })),
      layoutOf("Bytes on the wire (all workers)", mode, "bytes/s"), mode);
      PS.setCount(cards.bytes, lines.length * all.length, S.total, "iterations");
    });
    renderLr(mode);
    chart("timeline", ["timeline", "syncs", "events"], renderTimeline);
    renderElastic();
    // Samples are timed, not numbered: on the iteration axis they are shown against time.
    chart("cpu", ["procs"], () => renderProcesses(mode === "iteration" ? "elapsed" : mode), ["mem"]);
    if (eventsShown !== V.events) { eventsShown = V.events; renderEvents(); }
    const latest = Math.max(...S.last.map((p) => p.ended_at), -Infinity);
    probe.latestT = Number.isFinite(latest) ? latest : null;
    probe.renders.push([Date.now() / 1000, probe.latestT]);
    if (probe.renders.length > 500) probe.renders.shift();
    if (probe.allPainted === undefined) { probe.allPainted = performance.now(); document.body.dataset.complete = "1"; }
  }
  let eventsShown = -1;

  // The multiplier the servers applied each gradient with (aggregator weight x schedule x
  // staleness rule): flat for plain SGD, falling with a schedule, spread out by dynsgd.
  function renderLr(mode) {
    const box = cards.lr.div.parentElement;
    if (lrSeen !== V.records) {  // whether the card shows is decided on every change, seen or not
      lrSeen = V.records;
      box.hidden = !envelopeTraces(groups(), mode, "lr_min", "lr_max", "lr_scale")[0].some((t) => t.y.some((v) => v !== null && v !== undefined));
    }
    if (box.hidden) return;  // drawn only once shown: a hidden plot would lay out at 0 px
    chart("lr", ["records"], () => {
      const [traces, n] = envelopeTraces(groups(), mode, "lr_min", "lr_max", "lr_scale");
      drawSeries("lr", traces, layoutOf("Applied learning-rate scale (min and max per bucket)", mode, "factor on the learning rate"), mode);
      PS.setCount(cards.lr, n, S.total, "iterations");
    });
  }
  let lrSeen = -1;

  function renderHistogram() {
    const workers = new Map();
    for (const [key, n] of S.stale) { const [w, s] = key.split(":").map(Number); if (!workers.has(w)) workers.set(w, new Map()); workers.get(w).set(s, n); }
    const traces = [...workers.entries()].sort((a, b) => a[0] - b[0]).map(([w, m]) => {
      const xs = [...m.keys()].sort((a, b) => a - b);
      return { type: "bar", name: label(w), marker: { color: PS.color(w) }, x: xs, y: xs.map((s) => m.get(s)) };
    });
    PS.draw(cards.stale_h.div, traces, PS.layout("Staleness distribution (updates since the pull)", "staleness", "iterations",
      { xaxis: { title: { text: "staleness (updates since the pull)" }, dtick: 1 }, barmode: "group" }));
    const total = [...S.stale.values()].reduce((a, b) => a + b, 0);
    PS.setCount(cards.stale_h, total, S.total, "iterations");
  }

  function renderBreakdown(groups) {
    const ws = [...groups.keys()].filter((w) => w >= 0);
    const phases = [["compute", "#2ca02c"], ["push", "#1f77b4"], ["pull", "#9467bd"], ["wait", "#d62728"]];
    const traces = phases.map(([p, color]) => ({ type: "bar", orientation: "h", name: p, marker: { color },
      y: ws.map(label), x: ws.map((w) => groups.get(w).reduce((a, r) => a + r[S.f[p]], 0)) }));
    PS.draw(cards.breakdown.div, traces, PS.layout("Time per worker: compute / push / pull / wait", "s", "",
      { barmode: "stack", xaxis: { title: { text: "seconds spent per phase (compute, push, pull, wait)" } },
        yaxis: { title: { text: "worker" }, automargin: true, autorange: "reversed", type: "category", categoryorder: "array", categoryarray: ws.map(label) } }));
    PS.setCount(cards.breakdown, ws.length * 4, S.total, "iterations");
  }

  function renderTimeline() {
    const rows = S.timeline, wall = xSel.value === "wall";
    const t = (v) => wall ? new Date(v * 1000) : TS(v);
    const bar = (name, color, base, len) => ({ type: "bar", orientation: "h", name, marker: { color },
      y: rows.map((r) => label(r.worker)), base: rows.map((r) => t(base(r))), x: rows.map((r) => wall ? len(r) * 1000 : len(r)),
      customdata: rows.map((r) => r.iteration), hovertemplate: `${name} · iteration %{customdata}<extra>%{y}</extra>` });
    const traces = rows.length ? [bar("working", "#2ca02c", (r) => r.started_at, (r) => r.ended_at - r.started_at - r.wait_s),
      bar("waiting", "#d62728", (r) => r.ended_at - r.wait_s, (r) => r.wait_s)] : [];
    const lo = rows.length ? Math.min(...rows.map((r) => r.started_at)) : 0;
    const hi = rows.length ? Math.max(...rows.map((r) => r.ended_at)) : 0;
    // ElasticBSP barriers inside the window: a dotted line where each was released, and a
    // marker on top whose hover says which barrier and how long its arrivals were spread.
    const marks = [...S.syncs.values()].filter((s) => s.released_at && s.released_at >= lo);
    const faults = eventMarks(cards.timeline.div, t, lo, [{ x: [t(lo), t(hi)] }]);
    const shapes = marks.map((s) => ({ type: "line", xref: "x", yref: "paper", x0: t(s.released_at), x1: t(s.released_at),
      y0: 0, y1: 1, line: { color: "#333", dash: "dot", width: 1 } })).concat(faults.shapes);
    if (marks.length) traces.push({ type: "scatter", mode: "markers", name: "barrier released", yaxis: "y2", marker: { symbol: "triangle-down", color: "#333", size: 9 },
      x: marks.map((s) => t(s.released_at)), y: marks.map(() => 1), customdata: marks.map((s) => [s.sync_index, s.actual_wait === null ? "–" : (1000 * s.actual_wait).toFixed(1)]),
      hovertemplate: "barrier %{customdata[0]} · actual wait %{customdata[1]} ms<extra></extra>" });
    const span = S.timelineWindow ? ` (last ${S.timelineWindow} s` + (rows.length >= S.timelineLimit ? `, newest ${rows.length.toLocaleString()} rows)` : ")") : "";
    // Workers 0..n top to bottom, whatever order their rows arrived in (categories would
    // otherwise follow first appearance: 3, 2, 0, 1).
    const order = Array.from({ length: S.summary.workers }, (_, w) => label(w));
    PS.draw(cards.timeline.div, traces, layoutOf(`Synchronisation timeline${span}; ▼ dotted: barriers${faults.shapes.length ? "; dashed: fault tolerance" : ""}`, wall ? "wall" : "elapsed", "",
      { barmode: "overlay", shapes, annotations: faults.annotations, bargap: 0.3,
        yaxis: { title: { text: "worker" }, automargin: true, autorange: "reversed", type: "category", categoryorder: "array", categoryarray: order },
        yaxis2: { overlaying: "y", range: [0, 1.05], visible: false, fixedrange: true } }));
    PS.setCount(cards.timeline, rows.length, S.total, "iterations");
    cards.timeline.div.dataset.barriers = String(marks.length);
    cards.timeline.div.dataset.faultMarks = String(faults.shapes.length);
    cards.timeline.div.dataset.order = order.join(",");
  }

  function renderElastic() {
    const box = cards.elastic.div.parentElement;
    box.hidden = !(S.summary.sync === "elastic" || S.syncs.size > 0);
    if (box.hidden) return;  // drawn only once shown: a hidden plot would lay out at 0 px
    chart("elastic", ["syncs"], () => {
      // Sync 0 only watches the workers (nothing predicted); a barrier not yet reached has no
      // actual wait: both are left out, so each point pairs a prediction with what happened.
      const syncs = [...S.syncs.values()].filter((s) => s.predicted && s.predicted.length && s.actual_wait !== null)
        .sort((a, b) => a.sync_index - b.sync_index);
      const x = syncs.map((s) => s.sync_index);
      // How far ahead each barrier was placed: the farthest worker's iterations to it (r_i + 1).
      const distance = (s) => Math.max(0, ...(s.chosen || []).filter((r) => r >= 0).map((r) => r + 1));
      const traces = [{ type: "scatter", mode: "lines+markers", name: "predicted wait", x, y: syncs.map((s) => s.predicted_wait) },
        { type: "scatter", mode: "lines+markers", name: "actual wait", x, y: syncs.map((s) => s.actual_wait) },
        { type: "bar", name: "barrier distance (iterations)", x, y: syncs.map(distance), yaxis: "y2", opacity: 0.25 }];
      PS.draw(cards.elastic.div, traces, PS.layout("ElasticBSP: predicted vs actual wait and barrier distance", "barrier", "wait (s)",
        { xaxis: { title: { text: "barrier (sync index)" } }, meta: { empty: "no ElasticBSP barriers in this run yet" },
          yaxis2: { title: { text: "distance (iterations)" }, overlaying: "y", side: "right", rangemode: "tozero" } }));
      PS.setCount(cards.elastic, syncs.length, syncs.length);
    });
  }

  // CPU and memory per process (the two cards are drawn together: one set of samples).
  function renderProcesses(xMode) {
    const procs = processList();
    const trace = (p, i, ys) => ({ type: "scatter", mode: "lines", name: procLabel(p.role, p.rank), line: { color: PS.color(i), width: 1.3 },
      x: p.at.map((t) => X(xMode, t, null)), y: ys });
    const n = procs.reduce((a, p) => a + p.at.length, 0);
    const every = S.procThinned ? ", averaged over time" : S.procWidth > 0 ? `, averaged over ${S.procWidth} s` : "";
    drawSeries("cpu", procs.map((p, i) => trace(p, i, p.cpu)),
      layoutOf(`CPU per process${every}`, xMode, "CPU (% of one core)"), xMode);
    drawMemory(procs, trace, xMode, every);
    [cards.cpu, cards.mem].forEach((c) => { PS.setCount(c, n, n); c.div.dataset.traces = String(procs.length); });
  }
  // RSS per process, and where PSS was read (schema 8 on) PSS dotted in the same colour: RSS
  // counts the pages a process shares copy-on-write with the other roles in full, PSS only its
  // share of them, so PSS is what the processes' memory adds up to.
  function drawMemory(procs, trace, xMode, every) {
    const mb = (b) => b / 1e6, most = every ? ", maximum" + every : "";
    if (!procs.some((p) => p.pss.some((v) => v !== null))) {  // a run from before PSS
      drawSeries("mem", procs.map((p, i) => trace(p, i, p.rss.map(mb))),
        layoutOf(`Memory per process (RSS${most})`, xMode, "resident memory (MB)"), xMode);
      return;
    }
    const traces = procs.flatMap((p, i) => {
      const name = procLabel(p.role, p.rank), read = [];
      p.pss.forEach((v, k) => { if (v !== null) read.push(k); });
      const rss = Object.assign(trace(p, i, p.rss.map(mb)), { name: `${name} RSS`, legendgroup: name });
      // Markers too: a process read once (a large run's newcomer) is a point, not a line.
      const pss = { type: "scatter", mode: "lines+markers", name: `${name} PSS`, legendgroup: name,
        line: { color: PS.color(i), width: 1.3, dash: "dot" }, marker: { color: PS.color(i), size: 3 },
        x: read.map((k) => X(xMode, p.at[k], null)), y: read.map((k) => mb(p.pss[k])) };
      return [rss, pss];
    });
    const title = `Memory per process: RSS solid, PSS (shared pages split) dotted${most ? ` (${most.slice(2)})` : ""}`;
    drawSeries("mem", traces, layoutOf(title, xMode, "memory (MB)"), xMode);
  }

  // -- fault tolerance: events marked on the time charts, and banners --------------------------
  // kind -> [colour, label]: a dashed line at each event of the kind, labelled with
  // label(detail); a kind without a label is frequent and drawn thin and unlabelled. One line
  // here marks one more kind. Each chart's data-fault-marks counts its lines, all kinds.
  const MARKS = {
    fault_injected: ["#d62728", (d) => String(d.spec).split("@")[0].replaceAll(":", " ")],  // kill worker 1, drop 1%
    worker_lost: ["#ff7f0e", (d) => `worker ${d.rank} lost`],
    worker_rejoined: ["#2ca02c", (d) => `worker ${d.rank} rejoined`],
    resumed: ["#1f77b4", (d) => `resumed from checkpoint ${d.checkpoint}`],
    checkpoint_incomplete: ["#e0a100", (d) => `checkpoint ${d.seq} incomplete`],
    server_lost: ["#ff7f0e", (d) => `server ${d.rank} lost`],
    server_unresponsive: ["#d62728", (d) => `server ${d.rank} fenced`],
    fence_withheld: ["#e0a100", (d) => `server ${d.rank} waited for`],
    evaluator_lost: ["#ff7f0e", () => "evaluator lost"],
    evaluator_rejoined: ["#2ca02c", () => "evaluator rejoined"],
    diverged: ["#d62728", () => "diverged"],
    failover_complete: ["#2ca02c", (d) => `shard ${d.index} failed over (${d.seconds} s)`],
    membership: ["#9467bd", (d) => `${d.workers} workers`],
    scale_refused: ["#e0a100", (d) => `scale to ${d.workers ?? d.servers} refused`],
    server_rejoined: ["#2ca02c", (d) => `server ${d.rank} back`],
    rereplicated: ["#17becf", (d) => `shard ${d.index} copied to server ${d.rank}`],
    primary_moved: ["#17becf", (d) => `shard ${d.index} served by server ${d.rank}`],
    server_membership: ["#9467bd", (d) => `${d.servers} servers`],
    rereplication_failed: ["#e0a100", (d) => `shard ${d.index} copy failed`],
    move_failed: ["#e0a100", (d) => `shard ${d.index} move failed`],
    training_resumed: ["#9ecae1", null],
    checkpoint: ["#aaa", null],
  };
  // The marked events from `from` (unix s) on, for a chart whose traces span the x range: a
  // Plotly line shape at x = t(at) for each, and for the labelled kinds a label beside it.
  function eventMarks(div, t, from, traces) {
    const shapes = [], labels = [];
    S.events.filter((e) => Object.hasOwn(MARKS, e.kind) && e.at >= from).forEach((e) => {
      const [color, text] = MARKS[e.kind], x = t(e.at);
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
        line: { color, dash: "dash", width: text ? 1.5 : 0.8 } });
      if (text) labels.push({ x, text: text(e.detail || {}), color });
    });
    return { shapes, annotations: placeLabels(div, labels, traces) };
  }
  // Labels as annotations that never overlap: each goes to the highest row (from the top of the
  // plot down) where it clears every label already there, beside its line on the right (on the
  // left where it would run past the plot's edge). Widths are estimated from the text, generously
  // (a kill and the loss it causes are a moment apart, so labels crowd); a label that finds no
  // free row is left out, and a note says how many were.
  const LABEL = { charPx: 6.4, padPx: 8, rowPx: 15, gapPx: 6 };
  const escText = (s) => String(s).replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]);
  function placeLabels(div, labels, traces) {
    if (!labels.length) return [];
    let lo = Infinity, hi = -Infinity;
    const see = (v) => { const n = T.xNumber(v); if (Number.isFinite(n)) { lo = Math.min(lo, n); hi = Math.max(hi, n); } };
    traces.forEach((tr) => (tr.x || []).forEach(see));
    labels.forEach((l) => see(l.x));
    const size = div._fullLayout && div._fullLayout._size;  // Plotly's plot area, once drawn
    const w = size ? size.w : Math.max(120, (div.clientWidth || 560) - 100);
    const h = size ? size.h : Math.max(60, (div.clientHeight || 320) - 130);
    const rows = Array.from({ length: Math.max(1, Math.floor(h / LABEL.rowPx)) }, () => []);
    const scale = hi > lo ? w / (hi - lo) : 0;
    const out = [];
    let left = 0;
    labels.forEach((l) => {
      const px = (T.xNumber(l.x) - lo) * scale, width = l.text.length * LABEL.charPx + LABEL.padPx;
      const right = px + width <= w;
      const [a, b] = right ? [px, px + width] : [px - width, px];
      const row = rows.findIndex((spans) => spans.every(([s, f]) => b + LABEL.gapPx <= s || a >= f + LABEL.gapPx));
      if (row < 0) { left += 1; return; }
      rows[row].push([a, b]);
      out.push({ x: l.x, xref: "x", y: 1 - row * LABEL.rowPx / h, yref: "paper", yanchor: "top",
        xanchor: right ? "left" : "right", xshift: right ? 2 : -2, text: escText(l.text), showarrow: false,
        font: { size: 10, color: l.color }, bgcolor: "rgba(255,255,255,0.8)", borderpad: 1 });
    });
    if (left) {
      out.push({ text: `+${left} more labels: see Events`, showarrow: false, xref: "paper", yref: "paper", x: 1, y: 1,
        xanchor: "right", yanchor: "bottom", font: { size: 10, color: "#555" }, name: "more" });
    }
    div.dataset.labelsLeftOut = String(left);
    return out;
  }

  // The keys the servers stored, as `psctl runs show` says it (engine/db/stored.py sums what
  // each server's server_stats said at its end): a sparse range stores only the keys pushed.
  // A run whose servers said nothing of it (older runs, or none ended yet) shows nothing.
  function renderStored() {
    const line = document.getElementById("stored"), s = S.stored;
    line.hidden = !s;
    if (!s) return;
    const kind = s.sparse ? "sparse: only keys pushed are stored" : "dense";
    const each = s.keys ? `, ${(s.bytes / s.keys).toFixed(0)} bytes a key` : "";
    line.dataset.sparse = String(s.sparse);
    line.textContent = `keys the servers stored: ${s.keys.toLocaleString("en-US")} (${kind})${each}: ` +
      `${PS.bytes(s.bytes)} of values, optimizer state and key maps`;
  }

  function renderResumed() {
    const resumes = S.events.filter((e) => e.kind === "resumed");
    const banner = document.getElementById("resumed");
    banner.hidden = !resumes.length;
    const down = downSpans().reduce((a, d) => a + d.end - d.start, 0);
    banner.textContent = resumes.map((e) => `Resumed from checkpoint ${(e.detail || {}).checkpoint} at ${PS.date(e.at).slice(11)}`).join("; ") +
      (down > 0 ? `; down ${down < 60 ? down.toFixed(1) + " s" : PS.fmtS(down)} (to the first iteration after ${resumes.length > 1 ? "each" : "it"}), left out of training time` : "");
  }

  function renderFaults() {
    const specs = [...new Set(S.events.filter((e) => e.kind === "fault_injected").map((e) => (e.detail || {}).spec))];
    const banner = document.getElementById("faults");
    banner.hidden = !specs.length;
    banner.textContent = `Faults injected: ${specs.join(", ")}. Dashed lines on the charts mark each fault and what the system did.`;
  }

  // A run with more busy processes than cores measures contention as much as its sync model.
  function renderBanner() {
    const ev = S.events.find((e) => e.kind === "oversubscribed");
    const banner = document.getElementById("oversubscribed");
    banner.hidden = !ev;
    if (!ev) return;
    const sum = S.summary, busy = sum.workers + sum.servers + 1, cores = ev.detail && ev.detail.cores;
    const n = (k, noun) => `${k} ${noun}${k === 1 ? "" : "s"}`;
    banner.textContent = cores
      ? `Oversubscribed: ${busy} busy processes (${n(sum.workers, "worker")}, ${n(sum.servers, "server")}, 1 evaluator) shared ${n(cores, "CPU core")}. ` +
        "Timing comparisons on this run (throughput, waits, staleness) are confounded by CPU contention."
      : `Oversubscribed: ${(ev.detail && ev.detail.message) || "more busy processes than cores"}. Timing comparisons on this run are confounded by CPU contention.`;
  }

  // A simulated run's times are virtual: say so, with the models that made them (from the
  // run's "simulated" event; a run without one is known simulated from its config).
  function renderSimulated() {
    const ev = S.events.find((e) => e.kind === "simulated");
    const banner = document.getElementById("simulated");
    banner.hidden = !S.simulated;
    if (!S.simulated) return;
    if (!ev) {
      banner.textContent = "Simulated cluster, virtual time: every time on this page is the simulation's clock, not wall-clock time.";
      return;
    }
    const d = ev.detail || {};
    if (typeof d.note === "string") {  // the simulator says it in words
      banner.textContent = `Simulated cluster, virtual time: ${d.note}.`;
      return;
    }
    const how = (k) => (d[k] ? "measured" : "given");
    // A model of sparse samples' reference update is a batch's working set (its event says so).
    const update = d.update_of
      ? `${d.update_of} (${Number(d.update_keys || 0).toLocaleString("en-US")} keys)`
      : "dense update of the whole model";
    banner.textContent = `Simulated cluster, virtual time: compute ${Number(d.compute_ms).toPrecision(3)} ms per batch (${how("compute_measured")}), ` +
      `network ${d.network}, ${Number(d.update_ms).toPrecision(3)} ms per ${update} (${how("update_measured")}).`;
  }

  function renderEvents() {
    const body = document.querySelector("#events tbody");
    if (S.events.length === 0) {
      if (!body.querySelector(".empty")) body.replaceChildren(PS.el("tr", { class: "empty" }));
      body.firstChild.replaceChildren(PS.el("td", { colspan: "3", class: "muted" }, "no events recorded yet"));
      return;
    }
    if (body.childElementCount === S.events.length && !body.querySelector(".empty")) return;
    body.replaceChildren(...S.events.slice(-300).map((e) => {
      const tr = document.createElement("tr");
      tr.append(PS.el("td", {}, TS(e.at).toFixed(2)), PS.el("td", {}, e.kind),
        PS.el("td", { class: "detail", title: JSON.stringify(e.detail) }, words(e.detail)));
      return tr;
    }));
  }
  // An event's detail as words ("rank 1, reason: boom"), not JSON; the JSON is its tooltip.
  function words(detail) {
    if (detail === null || typeof detail !== "object") return String(detail ?? "");
    return Object.entries(detail).map(([k, v]) => {
      const value = v !== null && typeof v === "object" ? JSON.stringify(v) : String(v);
      return `${k.replace(/_/g, " ")}: ${value}`;
    }).join("; ");
  }

  connect();
})();
