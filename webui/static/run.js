// The run page: one websocket, a snapshot then deltas, every chart redrawn from local state.
"use strict";
(() => {
  const RUN = window.PSCTL_RUN;
  const api = (p) => `/api/runs/${RUN}/${p}`;
  const dl = (m) => [["CSV", api(`series/${m}/full.csv`)], ["JSON", api(`series/${m}/full.json`)]];
  const grid = document.getElementById("charts");
  const cards = {};
  [["acc", "accuracy"], ["tloss", "test_loss"], ["thr", "throughput"], ["loss", "loss"],
    ["stale_t", "staleness"], ["stale_h", "staleness"], ["breakdown", "wait"],
    ["idle", "idle_fraction"], ["timeline", null], ["elastic", null], ["bytes", "bytes_sent"],
    ["lr", "lr_scale"], ["cpu", null], ["mem", null]]
    .forEach(([id, m]) => { cards[id] = PS.card(grid, id, m ? dl(m) : []); });
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
    procs: new Map(), procWidth: 0 };
  const probe = window.__psctl = { firstPaint: null, renders: [], latestT: null, messages: 0 };
  const xSel = document.getElementById("x-axis");
  xSel.addEventListener("change", () => schedule());

  function applySnapshot(m) {
    S.f = Object.fromEntries(m.record_fields.map((n, i) => [n, i]));
    S.records = new Map(); S.syncs = new Map(); S.stale = new Map();
    S.origin = m.origin; S.width = m.width; S.evals = m.evaluations; S.events = m.events;
    m.records.forEach((r) => S.records.set(r[0] + ":" + r[1], r));
    m.syncs.forEach((s) => S.syncs.set(s.sync_index, s));
    Object.assign(S, { last: m.last, timeline: m.timeline, summary: m.summary, total: m.total_rows,
      timelineWindow: m.timeline_window_s, timelineLimit: m.timeline_limit });
    document.getElementById("config").textContent = JSON.stringify(m.config, null, 2);
    document.getElementById("run-title").textContent = `${m.summary.name} (${m.summary.id.slice(0, 8)})`;
    if (m.reason) document.getElementById("run-summary").dataset.reason = m.reason;
  }

  function applyDelta(m) {
    S.summary = m.summary;
    if (m.records) {
      for (const key of [...S.records.keys()]) if (S.records.get(key)[1] >= m.from_bucket) S.records.delete(key);
      m.records.forEach((r) => S.records.set(r[0] + ":" + r[1], r));
      S.total = m.total_rows; S.last = m.last;
      m.staleness.forEach(([w, s, n]) => S.stale.set(w + ":" + s, (S.stale.get(w + ":" + s) || 0) + n));
    }
    if (m.timeline) S.timeline = m.timeline;
    if (m.evaluations) S.evals = S.evals.concat(m.evaluations);
    if (m.events) S.events = S.events.concat(m.events);
    if (m.syncs) m.syncs.forEach((s) => S.syncs.set(s.sync_index, s));
    if (m.process_samples) addSamples(m.process_samples);
  }

  // -- per-process samples: [role, rank, at, cpu %, rss bytes], one series per process --------
  const PROC_MAX = 1200;  // per process; past it, neighbours are averaged (a long live run)
  const ROLE_ORDER = { coordinator: 0, server: 1, worker: 2, evaluator: 3 };
  const procLabel = (role, rank) => role === "worker" || role === "server" ? `${role} ${rank}` : role;
  function addSamples(rows) {
    for (const [role, rank, at, cpu, rss] of rows) {
      const key = role + ":" + rank;
      if (!S.procs.has(key)) S.procs.set(key, { role, rank, at: [], cpu: [], rss: [] });
      const p = S.procs.get(key);
      p.at.push(at); p.cpu.push(cpu); p.rss.push(rss);
      if (p.at.length > PROC_MAX) thin(p);
    }
  }
  function thin(p) {
    const half = (xs, f) => {
      const out = [];
      for (let i = 0; i + 1 < xs.length; i += 2) out.push(f(xs[i], xs[i + 1]));
      if (xs.length % 2) out.push(xs[xs.length - 1]);  // the newest sample stays as it is
      return out;
    };
    const mean = (a, b) => (a + b) / 2;
    p.at = half(p.at, mean); p.cpu = half(p.cpu, mean); p.rss = half(p.rss, Math.max);
    S.procThinned = true;
  }
  function processList() {
    return [...S.procs.values()].sort((a, b) => (ROLE_ORDER[a.role] ?? 9) - (ROLE_ORDER[b.role] ?? 9) || a.rank - b.rank);
  }
  let csvUrl = null;
  function processCsv() {
    if (csvUrl) URL.revokeObjectURL(csvUrl);
    const lines = ["role,rank,at,cpu_percent,rss_bytes"];
    for (const p of processList()) p.at.forEach((t, i) => lines.push(`${p.role},${p.rank},${t},${p.cpu[i]},${Math.round(p.rss[i])}`));
    csvUrl = URL.createObjectURL(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
    return csvUrl;
  }

  // -- websocket with automatic reconnection -------------------------------------------------
  const badge = document.getElementById("live-badge");
  function setBadge(state) { badge.textContent = state; badge.className = "badge " + state; }
  let retry = 500, socket = null;
  function connect() {
    // The page's head opened the first socket already (see run.html); reconnections open anew.
    const early = window.__psctlEarly; window.__psctlEarly = null;
    const ws = early ? early.ws : new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/runs/${RUN}`);
    socket = ws;
    probe.connectAt = probe.connectAt || performance.now();
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data); probe.messages += 1; retry = 500;
      if (probe.messages === 1) probe.firstMessage = performance.now();
      if (m.type === "snapshot") { applySnapshot(m); ackDue = true; }
      else if (m.type === "delta") applyDelta(m);
      else if (m.type === "staleness") { S.stale = new Map(); m.counts.forEach(([w, s, n]) => S.stale.set(w + ":" + s, n)); }
      else if (m.type === "timeline") S.timeline = m.timeline;
      else if (m.type === "processes") { S.procs = new Map(); S.procWidth = m.width_s; S.procThinned = false; addSamples(m.samples); }
      else if (m.type === "error") { document.getElementById("run-summary").textContent = m.message; return; }
      setBadge(S.summary.status === "running" ? "live" : S.summary.status);
      schedule();
    };
    // A run that has ended changes no more: its final status stays the truth while the server
    // is away (stopped after the run, say), so it is not hidden behind "reconnecting".
    ws.onclose = () => {
      const ended = S.summary && S.summary.status !== "running";
      setBadge(ended ? S.summary.status : "reconnecting");
      setTimeout(connect, retry); retry = Math.min(retry * 2, 5000);
    };
    if (early) { early.queue.forEach((ev) => ws.onmessage(ev)); if (ws.readyState === WebSocket.CLOSED) ws.onclose(); }
  }
  // The server holds back the staleness histogram (a scan of every row) until the first charts
  // are on screen, so that scan does not compete with drawing them.
  let ackDue = false;
  function sayPainted() {
    if (ackDue && socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "painted" }));
    ackDue = false;
  }

  let pending = false;
  function schedule() { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; render(); }); } }

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
  const xOf = (mode, r) => PS.x(mode, r[S.f.t], S.origin, r[S.f.it]);
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
      if (last && last[lastKey] !== null) { x.push(PS.x(mode, last.ended_at, S.origin, last.iteration)); y.push(last[lastKey]); }
      out.push({ type: "scatter", mode: "lines", name: label(w), line: { color: PS.color(w), width: 1 }, x, y });
      n += x.length;
    }
    return [out, n];
  }

  function render() {
    const mode = xSel.value, groups = byWorker(), sum = S.summary;
    document.getElementById("run-summary").textContent = `${sum.status} · ${sum.sync} · ${sum.workers} workers × ${sum.servers} servers · ${sum.dataset} · ` +
      `${sum.iterations.toLocaleString()} iterations · best accuracy ${PS.pct(sum.best_accuracy)} · started ${PS.date(sum.started_at)} · `;
    const dur = document.getElementById("run-duration") || document.getElementById("run-summary").appendChild(PS.el("span", { id: "run-duration" }));
    dur.textContent = `duration ${PS.fmtS(sum.duration_s)}`;
    renderBanner(); renderSimulated(); renderResumed(); renderFaults();
    const ready = plotly === "ready";
    const top = (card, traces, layout) => {
      if (!ready) { preview(card.div, traces, layout); return; }
      if (card.div.dataset.preview) { card.div.replaceChildren(); delete card.div.dataset.preview; }
      PS.draw(card.div, traces, layout);
    };
    const ex = (e) => PS.x(mode, e.at, S.origin, e.step);
    // Events have a time, not an iteration: on the iteration axis they are not marked.
    const shapes = mode === "iteration" ? [] : eventShapes((at) => PS.x(mode, at, S.origin, null), -Infinity);
    [cards.acc, cards.tloss, cards.thr, cards.loss].forEach((c) => { c.div.dataset.faultMarks = String(shapes.length); });
    top(cards.acc, [{ type: "scatter", mode: "lines+markers", name: "test accuracy", x: S.evals.map(ex), y: S.evals.map((e) => 100 * e.accuracy) }],
      PS.layout("Test accuracy", mode, "accuracy (%)", { showlegend: false, shapes }));
    PS.setCount(cards.acc, S.evals.length, S.evals.length);
    // Sparse logistic regression records its training objective as the evaluation's loss.
    const objective = sum.dataset === "sparse-synthetic";
    top(cards.tloss, [{ type: "scatter", mode: "lines+markers", name: objective ? "objective" : "test loss", x: S.evals.map(ex), y: S.evals.map((e) => e.loss) }],
      PS.layout(objective ? "Training objective" : "Test loss", mode, objective ? "logistic loss + l1 |w|" : "cross-entropy", { showlegend: false, shapes }));
    PS.setCount(cards.tloss, S.evals.length, S.evals.length);
    const [thrAll, nAll] = lineTraces(groups, mode, "throughput", { only: "all" });
    const [thrW, nW] = lineTraces(groups, mode, "throughput", {});
    top(cards.thr, thrAll.concat(thrW), PS.layout("Throughput", mode, "samples/s", { shapes }));
    PS.setCount(cards.thr, nAll + nW, S.total, "iterations");
    const [lossT, nLoss] = envelopeTraces(groups, mode, "loss_min", "loss_max", "loss");
    top(cards.loss, lossT, PS.layout("Training loss (min and max per bucket)", mode, "cross-entropy", { shapes }));
    PS.setCount(cards.loss, nLoss, S.total, "iterations");
    // The charts above the fold are drawn first (a preview until plotly.js runs); the rest
    // follow in the next task, so the page is readable before every chart is done.
    if (probe.firstPaint === null) {
      requestAnimationFrame(() => {
        probe.firstPaint = performance.now(); probe.preview = !ready;
        if (ready) probe.plotlyPaint = probe.firstPaint;
        document.body.dataset.painted = "1"; sayPainted();
        setTimeout(ready ? () => renderRest(mode, groups) : loadPlotly, 0);
      });
    } else if (!ready) {
      sayPainted();
    } else if (probe.plotlyPaint === undefined) {
      requestAnimationFrame(() => { probe.plotlyPaint = performance.now(); setTimeout(() => renderRest(mode, groups), 0); });
    } else { sayPainted(); renderRest(mode, groups); }
  }

  // -- plotly.js: fetched by the page's head (preload), run once the preview is on screen -----
  let plotly = "no";  // "no", then "loading", then "ready"
  function loadPlotly() {
    if (plotly !== "no") return;
    plotly = "loading";
    const script = PS.el("script", { src: window.PSCTL_PLOTLY });
    script.onload = () => { plotly = "ready"; if (S.summary) schedule(); };
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

  function renderRest(mode, groups) {
    const [stT, nSt] = envelopeTraces(groups, mode, "staleness_min", "staleness_max", "staleness");
    PS.draw(cards.stale_t.div, stT, PS.layout("Staleness over time (min and max per bucket)", mode, "staleness (updates since the pull)"));
    PS.setCount(cards.stale_t, nSt, S.total, "iterations");
    renderHistogram(); renderBreakdown(groups);
    const [idleT, nIdle] = lineTraces(groups, mode, "idle_fraction", { scale: 100 });
    PS.draw(cards.idle.div, idleT, PS.layout("Idle (wait) fraction per worker", mode, "idle (% of wall time)"));
    PS.setCount(cards.idle, nIdle, S.total, "iterations");
    const all = (groups.get(-1) || []).slice(0, S.summary.status === "running" ? -1 : undefined);
    // Push bytes as sent and as dense float32 pushes would have been: apart when a push
    // filter or a narrow wire type saves bytes (runs before schema 5 have neither line).
    // The pull bytes SSP's cache saved: drawn only where some read was answered from it.
    const lines = [["sent_per_s", "sent"], ["received_per_s", "received"], ["pushed_per_s", "pushes sent"],
      ["pushed_dense_per_s", "pushes before filtering"], ["pull_saved_per_s", "pulls the cache saved"]]
      .filter(([c]) => all.some((r) => r[S.f[c]] !== null && r[S.f[c]] !== undefined
        && (c !== "pull_saved_per_s" || r[S.f[c]] > 0)));
    PS.draw(cards.bytes.div, lines.map(([c, name], i) => ({ type: "scatter", mode: "lines", name,
      line: { color: PS.color(i), dash: i % 2 ? "solid" : "dash", width: i % 2 ? 1.5 : 2.5 }, x: all.map((r) => xOf(mode, r)), y: all.map((r) => r[S.f[c]]) })), PS.layout("Bytes on the wire (all workers)", mode, "bytes/s"));
    PS.setCount(cards.bytes, lines.length * all.length, S.total, "iterations");
    renderLr(mode, groups);
    renderTimeline(); renderElastic(); renderProcesses(mode); renderEvents();
    const latest = Math.max(...S.last.map((p) => p.ended_at), -Infinity);
    probe.latestT = Number.isFinite(latest) ? latest : null;
    probe.renders.push([Date.now() / 1000, probe.latestT]);
    if (probe.renders.length > 500) probe.renders.shift();
    if (probe.allPainted === undefined) { probe.allPainted = performance.now(); document.body.dataset.complete = "1"; }
  }

  // The multiplier the servers applied each gradient with (aggregator weight x schedule x
  // staleness rule): flat for plain SGD, falling with a schedule, spread out by dynsgd.
  function renderLr(mode, groups) {
    const box = cards.lr.div.parentElement;
    const [traces, n] = envelopeTraces(groups, mode, "lr_min", "lr_max", "lr_scale");
    box.hidden = !traces.some((t) => t.y.some((v) => v !== null && v !== undefined));
    if (box.hidden) return;  // drawn only once shown: a hidden plot would lay out at 0 px
    PS.draw(cards.lr.div, traces, PS.layout("Applied learning-rate scale (min and max per bucket)", mode, "factor on the learning rate"));
    PS.setCount(cards.lr, n, S.total, "iterations");
  }

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
    const t = (v) => wall ? new Date(v * 1000) : v - S.origin;
    const bar = (name, color, base, len) => ({ type: "bar", orientation: "h", name, marker: { color },
      y: rows.map((r) => label(r.worker)), base: rows.map((r) => t(base(r))), x: rows.map((r) => wall ? len(r) * 1000 : len(r)),
      customdata: rows.map((r) => r.iteration), hovertemplate: `${name} · iteration %{customdata}<extra>%{y}</extra>` });
    const traces = rows.length ? [bar("working", "#2ca02c", (r) => r.started_at, (r) => r.ended_at - r.started_at - r.wait_s),
      bar("waiting", "#d62728", (r) => r.ended_at - r.wait_s, (r) => r.wait_s)] : [];
    const lo = rows.length ? Math.min(...rows.map((r) => r.started_at)) : 0;
    // ElasticBSP barriers inside the window: a dotted line where each was released, and a
    // marker on top whose hover says which barrier and how long its arrivals were spread.
    const marks = [...S.syncs.values()].filter((s) => s.released_at && s.released_at >= lo);
    const faults = eventShapes(t, lo);
    const shapes = marks.map((s) => ({ type: "line", xref: "x", yref: "paper", x0: t(s.released_at), x1: t(s.released_at),
      y0: 0, y1: 1, line: { color: "#333", dash: "dot", width: 1 } })).concat(faults);
    if (marks.length) traces.push({ type: "scatter", mode: "markers", name: "barrier released", yaxis: "y2", marker: { symbol: "triangle-down", color: "#333", size: 9 },
      x: marks.map((s) => t(s.released_at)), y: marks.map(() => 1), customdata: marks.map((s) => [s.sync_index, s.actual_wait === null ? "–" : (1000 * s.actual_wait).toFixed(1)]),
      hovertemplate: "barrier %{customdata[0]} · actual wait %{customdata[1]} ms<extra></extra>" });
    const span = S.timelineWindow ? ` (last ${S.timelineWindow} s` + (rows.length >= S.timelineLimit ? `, newest ${rows.length.toLocaleString()} rows)` : ")") : "";
    // Workers 0..n top to bottom, whatever order their rows arrived in (categories would
    // otherwise follow first appearance: 3, 2, 0, 1).
    const order = Array.from({ length: S.summary.workers }, (_, w) => label(w));
    PS.draw(cards.timeline.div, traces, PS.layout(`Synchronisation timeline${span}; ▼ dotted: barriers${faults.length ? "; dashed: fault tolerance" : ""}`, wall ? "wall" : "elapsed", "",
      { barmode: "overlay", shapes, bargap: 0.3,
        yaxis: { title: { text: "worker" }, automargin: true, autorange: "reversed", type: "category", categoryorder: "array", categoryarray: order },
        yaxis2: { overlaying: "y", range: [0, 1.05], visible: false, fixedrange: true } }));
    PS.setCount(cards.timeline, rows.length, S.total, "iterations");
    cards.timeline.div.dataset.barriers = String(marks.length);
    cards.timeline.div.dataset.faultMarks = String(faults.length);
    cards.timeline.div.dataset.order = order.join(",");
  }

  function renderElastic() {
    const box = cards.elastic.div.parentElement;
    box.hidden = !(S.summary.sync === "elastic" || S.syncs.size > 0);
    if (box.hidden) return;  // drawn only once shown: a hidden plot would lay out at 0 px
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
    const note = syncs.length ? [] : [{ text: "no ElasticBSP barriers in this run", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }];
    PS.draw(cards.elastic.div, traces, PS.layout("ElasticBSP: predicted vs actual wait and barrier distance", "barrier", "wait (s)",
      { xaxis: { title: { text: "barrier (sync index)" } }, annotations: note,
        yaxis2: { title: { text: "distance (iterations)" }, overlaying: "y", side: "right", rangemode: "tozero" } }));
    PS.setCount(cards.elastic, syncs.length, syncs.length);
  }

  function renderProcesses(mode) {
    // Samples are timed, not numbered: on the iteration axis they are shown against time.
    const xMode = mode === "iteration" ? "elapsed" : mode;
    const procs = processList();
    const trace = (p, i, ys) => ({ type: "scatter", mode: "lines", name: procLabel(p.role, p.rank), line: { color: PS.color(i), width: 1.3 },
      x: p.at.map((t) => PS.x(xMode, t, S.origin, null)), y: ys });
    const n = procs.reduce((a, p) => a + p.at.length, 0);
    const every = S.procThinned ? ", averaged over time" : S.procWidth > 0 ? `, averaged over ${S.procWidth} s` : "";
    PS.draw(cards.cpu.div, procs.map((p, i) => trace(p, i, p.cpu)),
      PS.layout(`CPU per process${every}`, xMode, "CPU (% of one core)"));
    PS.draw(cards.mem.div, procs.map((p, i) => trace(p, i, p.rss.map((b) => b / 1e6))),
      PS.layout(`Memory per process (RSS${every ? ", maximum" + every : ""})`, xMode, "resident memory (MB)"));
    [cards.cpu, cards.mem].forEach((c) => { PS.setCount(c, n, n); c.div.dataset.traces = String(procs.length); });
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
  // Plotly layout shapes for the marked events from `from` (unix s) on, at x = t(at).
  function eventShapes(t, from) {
    let labelled = 0;
    return S.events.filter((e) => Object.hasOwn(MARKS, e.kind) && e.at >= from).map((e) => {
      const [color, text] = MARKS[e.kind], x = t(e.at);
      const shape = { type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
        line: { color, dash: "dash", width: text ? 1.5 : 0.8 } };
      if (!text) return shape;
      // Along the line, on its right, inside the plot; alternately from the top and from the
      // bottom, as a kill and the loss it causes are a moment apart.
      const [textposition, xanchor] = labelled++ % 2 ? ["start", "left"] : ["end", "right"];
      return { ...shape, label: { text: text(e.detail || {}), font: { size: 10, color }, textposition, xanchor, yanchor: "top" } };
    });
  }

  function renderResumed() {
    const resumes = S.events.filter((e) => e.kind === "resumed");
    const banner = document.getElementById("resumed");
    banner.hidden = !resumes.length;
    banner.textContent = resumes.map((e) => `Resumed from checkpoint ${(e.detail || {}).checkpoint} at ${PS.date(e.at).slice(11)}`).join("; ");
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

  // A simulated run's times are virtual: say so, with the models that made them.
  function renderSimulated() {
    const ev = S.events.find((e) => e.kind === "simulated");
    const banner = document.getElementById("simulated");
    banner.hidden = !ev;
    if (!ev) return;
    const d = ev.detail || {};
    const how = (k) => (d[k] ? "measured" : "given");
    banner.textContent = `Simulated cluster, virtual time: compute ${Number(d.compute_ms).toPrecision(3)} ms per batch (${how("compute_measured")}), ` +
      `network ${d.network}, ${Number(d.update_ms).toPrecision(3)} ms per dense update of the whole model (${how("update_measured")}).`;
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
      tr.append(PS.el("td", {}, (e.at - S.origin).toFixed(2)), PS.el("td", {}, e.kind),
        PS.el("td", { class: "detail" }, JSON.stringify(e.detail)));
      return tr;
    }));
  }

  connect();
})();
