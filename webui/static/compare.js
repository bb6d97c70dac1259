// The compare page: several metrics of several runs at once, a chart each (small multiples on
// one x axis: seconds of training from each run's first iteration unless chosen otherwise), each
// with its own smoothing and log scale and a cursor linked across them (chart_tools.js); a group
// of repeated runs as its mean with a ± standard deviation band; then the metrics table
// `psctl compare` prints, its metric columns before the settings that differ.
"use strict";
(() => {
  const RUNS = window.PSCTL_RUNS;
  const T = window.psctlChartTools;
  // key: [title, series column, scale, unit, evaluation?]. Evaluations are sparse (one point
  // every few seconds), so they are drawn as markers of the raw values; an EMA over a handful
  // of points lags far behind them, so smoothing draws it over them, never instead.
  const METRICS = {
    accuracy: ["Test accuracy", "accuracy", 100, "accuracy (%)", true],
    test_loss: ["Test loss", "loss", 1, "cross-entropy", true],
    throughput: ["Throughput (all workers)", "throughput", 1, "samples/s", false],
    loss: ["Training loss (max per bucket)", "loss_max", 1, "cross-entropy", false],
    staleness: ["Staleness (max per bucket)", "staleness_max", 1, "updates since the pull", false],
    idle_fraction: ["Wait share (all workers)", "idle_fraction", 100, "waiting (% of wall time)", false],
    bytes_sent: ["Bytes sent (all workers)", "sent_per_s", 1, "bytes/s", false],
    bytes_received: ["Bytes received (all workers)", "received_per_s", 1, "bytes/s", false],
    push_bytes: ["Push bytes sent (all workers)", "pushed_per_s", 1, "bytes/s", false],
    lr_scale: ["Applied learning-rate scale (max)", "lr_max", 1, "factor", false],
  };
  const DEFAULT_METRICS = ["accuracy", "throughput", "loss", "staleness"];
  // A metric the runs' own code logged (psctl.log) is "user:NAME" here; in the address it is
  // its own name, "user:NAME" only where that is also one of the page's metrics.
  const USER = "user:";
  const X_TITLE = {
    train: "training time (s, from the first iteration)",
    elapsed: "time since start (s, start-up included)",
    wall: "wall time", iteration: "iteration",
  };
  const $ = (id) => document.getElementById(id);
  const xSel = $("x-axis"), aggregate = $("aggregate"), targetIn = $("target"), baselineSel = $("baseline");
  const grid = $("compare-charts"), count = $("compare-count"), note = $("table-note");
  const picks = $("metrics"), legendBox = $("compare-legend"), tableMetric = $("table-metric");
  const params = new URLSearchParams(location.search);
  const cache = new Map();
  const cards = new Map();  // metric -> {box, div, count, tools}
  const userNames = new Set();
  const hidden = new Set();  // legend keys (run id, "group:NAME") hidden on every chart
  let userData = new Map();  // run id -> /api/runs/RUN/user-metrics body
  let runs = [];  // {id, name, sync, group, backend, started_at, first_iteration_at, downtime...}
  const byId = new Map();
  let cursors = null;  // chart_tools' linked-cursor group of the charts drawn so far

  const isUser = (m) => m.startsWith(USER);
  const info = (m) => isUser(m)
    ? [m.slice(USER.length) + " (logged)", "value", 1, m.slice(USER.length), false]
    : METRICS[m];
  const isEval = (m) => info(m)[4];
  const known = (m) => m in METRICS || (isUser(m) && userNames.has(m.slice(USER.length)));

  // -- the metric picks: a checkbox each, the choice kept in the address ----------------------
  let selected = (params.get("metrics") || "").split(",").filter(Boolean);
  if (!selected.length) selected = DEFAULT_METRICS.slice();
  if (params.get("x") in X_TITLE) xSel.value = params.get("x");
  function addPick(metric) {
    const box = PS.el("input", { type: "checkbox", name: "metric", value: metric });
    box.checked = selected.includes(metric);
    box.addEventListener("change", () => {
      selected = [...picks.querySelectorAll("input[name=metric]:checked")].map((b) => b.value);
      remember(); draw();
    });
    const label = PS.el("label", { class: "pick", title: info(metric)[0] });
    label.append(box, " " + (isUser(metric) ? info(metric)[0] : METRICS[metric][0].replace(/ \(.*\)$/, "")));
    picks.appendChild(label);
  }
  Object.keys(METRICS).forEach(addPick);
  const toAddress = (m) => isUser(m) && !(m.slice(USER.length) in METRICS) ? m.slice(USER.length) : m;
  const fromAddress = (m) => !(m in METRICS) && !isUser(m) && userNames.has(m) ? USER + m : m;
  // The address's metrics once the logged names are known: each read as the page's or a
  // logged one, and any that is neither said, not dropped without a word.
  function reconcile() {
    selected = selected.map(fromAddress);
    const unknown = selected.filter((m) => !known(m)), box = $("compare-unknown");
    box.hidden = !unknown.length;
    box.textContent = unknown.length ? `Not drawn: no metric ${unknown.map((m) => `"${m}"`).join(", ")} ` +
      `(metrics= in the address). The page's are ${Object.keys(METRICS).join(", ")}` +
      (userNames.size ? `; these runs logged ${[...userNames].sort().join(", ")}.` : "; these runs logged none of their own.") : "";
  }
  function remember() {
    const q = new URLSearchParams(location.search);
    q.set("metrics", selected.map(toAddress).join(","));
    if (xSel.value !== "train") q.set("x", xSel.value); else q.delete("x");
    history.replaceState(null, "", "?" + q.toString().replace(/%2C/gi, ",").replace(/%3A/gi, ":"));
  }

  async function fetchJSON(url) {
    const r = await fetch(url);
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.detail || `${r.status} ${r.statusText}`);
    return body;
  }
  function fetchSeries(run, metric) {
    if (isUser(metric)) return Promise.resolve(userSeries(run, metric.slice(USER.length)));
    const key = run + "/" + metric;
    if (!cache.has(key)) cache.set(key, fetchJSON(`/api/runs/${run}/series/${metric}`));
    return cache.get(key);
  }

  // A logged metric of one run in the shape of /api/runs/RUN/series: the workers' series
  // averaged point by point (each is cut into the same number of buckets of its own
  // iterations), or the evaluator's where only it logged the metric.
  function userSeries(run, name) {
    const body = userData.get(run);
    const found = body && body.metrics.find((m) => m.name === name);
    const all = { t: [], iteration: [], value: [] };
    let rows = 0;
    if (found) {
      const workers = found.series.filter((s) => s.role === "worker");
      const use = workers.length ? workers : found.series.filter((s) => s.role === "evaluator");
      const n = Math.min(...use.map((s) => s.value.length));
      for (let i = 0; i < n; i++) {
        const mean = (k) => use.reduce((a, s) => a + s[k][i], 0) / use.length;
        all.t.push(mean("at")); all.iteration.push(mean("iteration")); all.value.push(mean("value"));
      }
      rows = use.reduce((a, s) => a + s.rows, 0);
    }
    return { series: { all }, points_shown: all.t.length, points_total: rows };
  }
  async function loadUserMetrics() {
    // Another page's endpoint: a server without it (or a run without logged metrics) only
    // means there is nothing more to offer.
    const bodies = await Promise.all(RUNS.map((r) =>
      fetchJSON(`/api/runs/${r}/user-metrics`).catch(() => null)));
    userData = new Map(RUNS.map((r, i) => [r, bodies[i]]));
    const names = new Set();
    bodies.forEach((b) => (b && Array.isArray(b.metrics) ? b.metrics : []).forEach((m) => names.add(m.name)));
    const fresh = [...names].sort().filter((name) => !userNames.has(name));
    fresh.forEach((name) => userNames.add(name));
    reconcile();  // before the picks are made: one named in the address starts checked
    fresh.forEach((name) => {
      addPick(USER + name);
      tableMetric.appendChild(PS.el("option", { value: name }, name));
    });
    $("table-metric-label").hidden = userNames.size === 0;
  }

  // -- each run's clock ------------------------------------------------------------------------
  // Training time: seconds from the run's first iteration, less the downtime of a resumed run
  // before that moment (PS.trainingS, the clock every view reads: engine/db/clock.py), as
  // psctl compare and plot count time to target; start-up is off the axis (listed above it).
  // Time since start counts from the command's start: start-up, one number, included.
  function xOf(mode, run, t, it) {
    if (mode === "wall") return t * 1000;
    if (mode === "iteration") return it;
    if (mode === "elapsed") return t - commandStart(run);
    return Math.max(0, PS.trainingS(run, t, run.started_at));
  }
  const commandStart = (run) => run.first_iteration_at != null && run.startup_s != null
    ? run.first_iteration_at - run.startup_s : run.started_at;

  // Groups of at least two of the compared runs (launch --repeat tags each with its group).
  function groups() {
    const g = new Map();
    runs.forEach((r) => { if (r.group !== null) g.set(r.group, [...(g.get(r.group) || []), r.id]); });
    return new Map([...g].filter(([, ids]) => ids.length >= 2));
  }

  // A run's points [x, y]: numbers (wall time in ms), in time order. A resumed run's line
  // breaks where it was down ([x, null]: Plotly leaves a gap), on every x axis.
  function points(run, body, col, scale, mode) {
    const s = body.series.all || { t: [], iteration: [] };
    const ys = s[col] || [];
    const raw = [];
    s.t.forEach((t, i) => {
      const y = ys[i];
      if (t !== null && y !== null && y !== undefined && Number.isFinite(y)) raw.push([t, y * scale, s.iteration[i]]);
    });
    raw.sort((a, b) => a[0] - b[0]);
    const ends = (run.downtime || []).map((d) => d.end);
    const pts = [];
    raw.forEach(([t, y, it], i) => {
      const prev = i > 0 ? raw[i - 1][0] : -Infinity;
      if (i > 0 && ends.some((e) => e > prev && e <= t)) pts.push([xOf(mode, run, prev, it), null]);
      pts.push([xOf(mode, run, t, it), y]);
    });
    // By iteration, a resumed run redoes the iterations since its checkpoint: kept in x order.
    if (mode === "iteration") return pts.filter((p) => p[1] !== null).sort((a, b) => a[0] - b[0]);
    return pts;
  }
  const toX = (mode, xs) => mode === "wall" ? xs.map((x) => new Date(x)) : xs;

  // Linear interpolation of sorted points at x, inside their range.
  function interp(pts, x) {
    let lo = 0, hi = pts.length - 1;
    if (x <= pts[0][0]) return pts[0][1];
    if (x >= pts[hi][0]) return pts[hi][1];
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (pts[mid][0] <= x) lo = mid; else hi = mid; }
    const [x0, y0] = pts[lo], [x1, y1] = pts[hi];
    return x1 === x0 ? y1 : y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  }

  const GRID_POINTS = 400;
  // Mean and sample standard deviation (n - 1, as `psctl compare` computes) of the runs on a
  // common grid: every x any run has inside the range all of them cover (thinned to
  // GRID_POINTS), each run's value there interpolated linearly between its own points.
  function band(all) {
    const series = all.map((p) => p.filter((q) => q[1] !== null));
    if (series.some((p) => p.length === 0)) return null;
    const lo = Math.max(...series.map((p) => p[0][0])), hi = Math.min(...series.map((p) => p[p.length - 1][0]));
    if (lo > hi) return null;
    let xs = [...new Set(series.flatMap((p) => p.map((q) => q[0])).filter((x) => x >= lo && x <= hi))]
      .sort((a, b) => a - b);
    if (xs.length > GRID_POINTS) xs = Array.from({ length: GRID_POINTS }, (_, i) => lo + (hi - lo) * i / (GRID_POINTS - 1));
    const n = series.length, mean = [], std = [];
    xs.forEach((x) => {
      const v = series.map((p) => interp(p, x)), m = v.reduce((a, b) => a + b, 0) / n;
      mean.push(m);
      std.push(Math.sqrt(v.reduce((a, b) => a + (b - m) ** 2, 0) / (n - 1)));
    });
    return { x: xs, mean, std };
  }

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  // The smoothed line (chart_tools' debiased EMA) is an overlay, dashed and named so: the raw
  // values stay drawn, faint for dense iteration metrics, as markers for evaluations.
  function runTraces(run, pts, color, metric, mode, weight) {
    const x = toX(mode, pts.map((p) => p[0])), y = pts.map((p) => p[1]), ev = isEval(metric);
    // A line needs two points: a short run's one bucket would otherwise not be seen at all.
    const marked = ev || y.filter((v) => v !== null).length < 3;
    const raw = { type: "scatter", name: run.name, x, y, legendgroup: run.id, showlegend: false,
      mode: marked ? "lines+markers" : "lines", marker: { size: 6, color }, line: { color, width: 1.5 } };
    if (!(weight > 0)) return [raw];
    if (!ev) Object.assign(raw, { opacity: 0.35, line: { color, width: 1 } });
    return [raw, { type: "scatter", mode: "lines", name: `${run.name} (EMA ${weight})`, x, y: T.smooth(y, weight),
      legendgroup: run.id, showlegend: false, line: { color, width: 2, dash: "dash" } }];
  }

  function groupTraces(name, ids, b, color, metric, mode, weight) {
    const x = toX(mode, b.x), group = "group:" + name;
    const sm = (ys) => weight > 0 ? T.smooth(ys, weight) : ys;
    const mean = sm(b.mean), std = sm(b.std);
    const lower = mean.map((m, k) => m - std[k]), upper = mean.map((m, k) => m + std[k]);
    const label = `${name} (${ids.length} runs, mean ± std${weight > 0 ? `, EMA ${weight}` : ""})`;
    return [
      { type: "scatter", mode: "lines", name: `${name} mean − std`, x, y: lower, legendgroup: group,
        showlegend: false, hoverinfo: "skip", line: { width: 0, color } },
      { type: "scatter", mode: "lines", name: `${name} mean + std`, x, y: upper, legendgroup: group,
        showlegend: false, hoverinfo: "skip", fill: "tonexty", fillcolor: rgba(color, 0.22),
        line: { width: 0, color }, meta: "band" },
      { type: "scatter", name: label, x, y: mean, legendgroup: group, showlegend: false,
        mode: isEval(metric) ? "lines+markers" : "lines", marker: { size: 5, color }, line: { color, width: 2.5 } },
    ];
  }

  // What is drawn: groups (aggregated) first, then the runs outside them, each with its colour,
  // the same on every chart and in the legend above them.
  function lines() {
    const shownGroups = aggregate.checked ? groups() : new Map();
    const out = [];
    shownGroups.forEach((ids, name) => out.push({ key: "group:" + name, name, ids, group: true }));
    const banded = new Set([...shownGroups.values()].flat());
    RUNS.forEach((id) => {
      if (!banded.has(id)) out.push({ key: id, name: (byId.get(id) || { name: id.slice(0, 8) }).name, ids: [id], group: false });
    });
    out.forEach((l, i) => { l.color = PS.color(i); });
    return out;
  }

  function drawLegend(all) {
    legendBox.replaceChildren(...all.map((l) => {
      const run = l.group ? null : byId.get(l.ids[0]);
      const text = l.group ? `${l.name} (${l.ids.length} runs, mean ± std)` : l.name;
      const item = PS.el("button", { type: "button", class: "legend-item" + (hidden.has(l.key) ? " off" : ""),
        "data-key": l.key, "aria-pressed": String(!hidden.has(l.key)), title: "hide or show on every chart" });
      const swatch = PS.el("span", { class: "swatch" });
      swatch.style.background = l.color;
      item.append(swatch, text);
      if (run && run.backend === "sim") item.appendChild(PS.el("span", { class: "sim", title: "virtual time" }, "sim"));
      item.addEventListener("click", () => { hidden.has(l.key) ? hidden.delete(l.key) : hidden.add(l.key); draw(); });
      return item;
    }));
  }

  // -- the charts ------------------------------------------------------------------------------
  function card(metric) {
    if (cards.has(metric)) return cards.get(metric);
    const [title] = info(metric);
    const box = PS.el("section", { class: "chart-box compare-box", "data-metric": metric });
    const head = PS.el("div", { class: "card-head" });
    head.appendChild(PS.el("h3", {}, title));
    const div = PS.el("div", { class: "compare-chart", id: "chart-" + metric.replace(/[^\w-]/g, "_") });
    const c = PS.el("p", { class: "count" });
    box.append(head, div, c);
    // Smoothing and log scale per chart (a loss reads best on a log axis, accuracy not),
    // remembered per metric by chart_tools.
    const entry = { box, div, count: c, data: null };
    entry.tools = T.controls(head, "compare-" + metric.replace(/[^\w-]/g, "_"), () => drawChart(metric));
    cards.set(metric, entry);
    return entry;
  }

  function drawChart(metric) {
    const entry = cards.get(metric);
    if (!entry || !entry.data) return;
    const [, col, scale, unit] = info(metric), mode = xSel.value;
    const { smoothing, log } = entry.tools.state();
    const byRun = new Map(RUNS.map((r, i) => [r, points(byId.get(r) || { id: r, started_at: 0 }, entry.data[i], col, scale, mode)]));
    const traces = [], notes = [];
    lines().forEach((l) => {
      if (hidden.has(l.key)) return;
      if (l.group) {
        const b = band(l.ids.map((id) => byRun.get(id)));
        if (b !== null) { traces.push(...groupTraces(l.name, l.ids, b, l.color, metric, mode, smoothing)); return; }
        // No stretch of x that all its runs cover (a short run's few points): no mean to
        // draw, so each run's own line, in the group's colour.
        notes.push(`group ${l.name}: its runs share no x range, so each is drawn alone`);
        l.ids.forEach((id) => traces.push(...runTraces(byId.get(id) || { id, name: id.slice(0, 8) },
          byRun.get(id), l.color, metric, mode, smoothing)));
      } else {
        traces.push(...runTraces(byId.get(l.ids[0]) || { id: l.ids[0], name: l.name }, byRun.get(l.ids[0]), l.color, metric, mode, smoothing));
      }
    });
    let layout = PS.layout("", mode, unit, {
      title: { text: "" }, showlegend: false, margin: { l: 58, r: 12, t: 8, b: 8 },
      xaxis: { title: { text: X_TITLE[mode] }, automargin: true, type: mode === "wall" ? "date" : "linear" },
    });
    layout = T.logScale(layout, log);
    entry.div.dataset.xKind = mode;
    PS.draw(entry.div, traces, layout);
    const shown = entry.data.reduce((a, d) => a + d.points_shown, 0), total = entry.data.reduce((a, d) => a + d.points_total, 0);
    entry.count.textContent = [`showing ${shown.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} points`,
      ...(log ? ["values ≤ 0 are not drawn on a log axis"] : []), ...notes].join("; ");
    entry.div.dataset.points = String(shown);
    entry.div.dataset.draws = String(Number(entry.div.dataset.draws || 0) + 1);
  }

  let drawing = Promise.resolve();
  function draw() { drawing = drawing.then(drawNow, drawNow); return drawing; }
  async function drawNow() {
    const shown = selected.filter(known);
    [...cards.keys()].filter((m) => !shown.includes(m)).forEach((m) => { cards.get(m).box.remove(); cards.delete(m); });
    // In the picks' order, so that the grid does not reshuffle as metrics come and go.
    const order = [...picks.querySelectorAll("input[name=metric]")].map((b) => b.value).filter((m) => shown.includes(m));
    order.forEach((m) => grid.appendChild(card(m).box));
    let data;
    try {
      data = await Promise.all(order.map((m) => Promise.all(RUNS.map((r) => fetchSeries(r, m)))));
    } catch (e) {
      count.textContent = `could not load the series: ${e.message}`;
      return;
    }
    const all = lines();
    drawLegend(all);
    order.forEach((m, i) => { cards.get(m).data = data[i]; drawChart(m); });
    linkCursors(order);
    const notes = [];
    if (all.some((l) => l.group)) notes.push("a group is its mean ± sample standard deviation, interpolated over the x range all its runs cover");
    notes.push("smoothing (an EMA, dashed over the raw values) and log scale per chart; hover one chart to see the same moment on the others");
    count.textContent = order.length ? notes.join("; ") : "Choose a metric above to draw it.";
    grid.dataset.metrics = order.join(",");
    grid.dataset.drawn = "1";
    grid.dataset.draws = String(Number(grid.dataset.draws || 0) + 1);
    markPainted();
  }

  // Hovering one chart shows the same x on every other (all share the x axis kind). A chart
  // is linked once, after its first draw; a removed one is skipped (it is no longer shown).
  function linkCursors(order) {
    if (!cursors) cursors = T.attachLinkedCursor([]);
    order.forEach((m) => cursors.add(cards.get(m).div));
  }

  // -- the metrics table: what `psctl compare --json` prints, formatted as its terminal table --
  const NUMERIC = (kind) => !["text", "config", "flag"].includes(kind);
  const pctText = (fraction) => `${+(100 * fraction).toFixed(2)} %`;
  let tableSeq = 0, lastBody = null;
  function tableParams() {
    const p = new URLSearchParams({ runs: RUNS.join(",") });
    const pct = Number(targetIn.value);
    if (!(targetIn.value !== "" && pct > 0 && pct <= 100)) throw new Error("the target accuracy is a percentage in (0, 100]");
    p.set("target", String(+(pct / 100).toFixed(6)));
    if (baselineSel.value) p.set("baseline", baselineSel.value);
    if (tableMetric.value) p.set("metric", tableMetric.value);
    // Groups shown as one band are one row too; unaggregated, a row per run (--per-run).
    if (!aggregate.checked) p.set("per_run", "true");
    return p;
  }
  // The command that prints the same table. Its target in percent too, as the page shows it
  // (psctl reads a value above 1 as a percentage; 1 % and below only as a fraction).
  function cliCommand(p) {
    const sel = RUNS.map((r) => r.slice(0, 8)).join(" "), t = Number(p.get("target"));
    return `psctl compare ${sel} --target ${t > 0.01 ? +(100 * t).toFixed(4) : t}` + (p.get("baseline") ? ` --baseline ${p.get("baseline").slice(0, 8)}` : "")
      + (p.get("metric") ? ` --metric ${p.get("metric")}` : "") + (p.get("per_run") ? " --per-run" : "");
  }

  async function loadTable() {
    const seq = ++tableSeq;
    let p, body;
    try {
      p = tableParams();
      body = await fetchJSON(`/api/compare?${p}`);
    } catch (e) {
      if (seq !== tableSeq) return null;
      note.textContent = e.message; note.classList.add("error");
      $("compare-table").dataset.loaded = "error";
      return null;
    }
    if (seq !== tableSeq) return null;
    note.classList.remove("error");
    $("compare-cli").textContent = cliCommand(p);
    lastBody = body;
    renderTable(body);
    $("compare-table").dataset.seq = String(seq);
    return body;
  }

  // A cell of a group's row, "mean ± std", on two lines: the table stays narrow enough for
  // every metric to fit a 1,400 px window.
  function fill(td, text) {
    const at = text.indexOf(" ± ");
    if (at < 0 || $("cli-columns").checked) { td.textContent = text; return; }
    td.append(text.slice(0, at), PS.el("span", { class: "spread" }, text.slice(at)));
  }

  function renderTable(body) {
    const table = $("compare-table"), asCli = $("cli-columns").checked;
    const shown = body.columns.filter((c) => c.kind !== "std" && c.kind !== "ci");
    const settings = shown.filter((c) => c.kind === "config");
    // Folded: the run, then the metrics, then one column of the settings that differ.
    const cols = asCli ? shown : [...shown.filter((c) => c.kind !== "config"), ...(settings.length ? [{ key: "@settings", header: "settings that differ", kind: "settings" }] : [])];
    const grouped = body.columns.some((c) => c.kind === "std");
    note.textContent = `${body.rows.length} ${grouped ? "row" : "run"}(s)` +
      (grouped ? "; a group of repeated runs shows mean ± standard deviation (a speedup paired by seed: its 95 % interval)" : "") +
      (body.target !== null ? `; time to target: to ${pctText(body.target)} test accuracy, from the first iteration` : "") +
      "; the best value of each column is bold";
    // Folded, the headers may say more (the target) and break where a word is long.
    const header = (c) => asCli ? c.header
      : c.key === "time_to_target_s" && body.target !== null ? `to ${pctText(body.target)} (s)`
      : c.header.replace("oversubscribed", "over\u00adsubscribed");
    const head = PS.el("tr");
    cols.forEach((c) => head.appendChild(PS.el("th", { class: NUMERIC(c.kind) && c.kind !== "settings" ? "num" : "", title: c.key, "data-key": c.key }, header(c))));
    const tbody = PS.el("tbody");
    body.rows.forEach((row, i) => {
      const tr = PS.el("tr", { "data-id": String(row.id) });
      cols.forEach((c) => {
        const text = c.kind === "settings" ? "" : body.cells[i][c.key], cls = [];
        if (NUMERIC(c.kind) && c.kind !== "settings") cls.push("num");
        if (c.key in body.best && row[c.key] === body.best[c.key]) cls.push("best");
        if (c.key === "status") cls.push("status", String(row.status));
        const td = PS.el("td", { class: cls.join(" "), "data-key": c.key });
        if (c.kind === "settings") {
          td.classList.add("settings");
          settings.forEach((s) => {
            const value = body.cells[i][s.key];
            if (value !== "") td.appendChild(PS.el("span", { class: "setting", title: `${s.key}=${value}` }, `${s.key}=${value}`));
          });
        } else if (c.key === "id" && byId.has(row.id)) td.appendChild(PS.el("a", { href: `/runs/${row.id}`, title: row.id }, text));
        else if (c.key === "id" && row.runs > 1) {
          td.classList.add("group");
          td.appendChild(PS.el("a", { href: `/compare?group=${encodeURIComponent(row.id)}` }, text));
        } else fill(td, text);
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    const thead = PS.el("thead");
    thead.appendChild(head);
    table.replaceChildren(thead, tbody);
    table.dataset.loaded = "1";
    table.dataset.layout = asCli ? "cli" : "folded";
    markPainted();
  }

  function markPainted() {
    if (grid.dataset.drawn === "1" && $("compare-table").dataset.loaded) document.body.dataset.painted = "1";
  }

  function describeRuns() {
    $("compare-runs").textContent = runs.map((r) =>
      `${r.name} (${r.sync}, ${r.workers}×${r.servers}${r.group !== null ? `, group ${r.group}` : ""}` +
      `${r.backend === "sim" ? ", simulated: virtual time" : ""})`).join(" · ");
    // Start-up is kept apart from the x axis (and from time to target): said here instead.
    const startup = runs.map((r) => `${r.name} ${r.startup_s === null ? "–" : r.startup_s.toFixed(1) + " s"}`);
    const resumed = runs.filter((r) => (r.downtime || []).length);
    $("compare-clock").textContent = "Time counts from each run's first iteration; start-up before it: " + startup.join(", ") +
      (resumed.length ? `; ${resumed.map((r) => r.name).join(", ")} resumed: the downtime is left out of training time and drawn as a gap` : "") +
      (runs.some((r) => r.backend === "sim") ? "; sim runs count virtual time" : "") + ".";
  }

  async function start() {
    let body;
    try {
      // Per run (per_run): the runs' names, groups and clocks, whatever the aggregation.
      [body] = await Promise.all([
        fetchJSON(`/api/compare?${new URLSearchParams({ runs: RUNS.join(","), per_run: "true" })}`),
        loadUserMetrics(),
      ]);
    } catch (e) {
      $("compare-runs").textContent = `could not load the runs: ${e.message}`;
      return;
    }
    runs = body.runs;
    runs.forEach((r) => byId.set(r.id, r));
    runs.forEach((r) => baselineSel.appendChild(PS.el("option", { value: r.id }, r.name)));
    picks.querySelectorAll("input[name=metric]").forEach((b) => { b.checked = selected.includes(b.value); });
    describeRuns();
    if (groups().size) { $("aggregate-label").hidden = false; aggregate.checked = true; }
    await Promise.all([draw(), loadTable()]);
    listen();
  }

  // Live: the runs list is pushed over a websocket; when a compared run has new iterations,
  // evaluations or a new status, its series are fetched again, the charts redrawn and the
  // table measured again.
  const seen = new Map();
  let retry = 500;
  function listen() {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/runs`);
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data); retry = 500;
      if (m.type !== "runs") return;
      let changed = false;
      m.runs.filter((r) => RUNS.includes(r.id)).forEach((r) => {
        const key = [r.status, r.iterations, r.best_accuracy].join("/");
        if (seen.has(r.id) && seen.get(r.id) !== key) {
          changed = true;
          for (const k of [...cache.keys()]) if (k.startsWith(r.id + "/")) cache.delete(k);
        }
        seen.set(r.id, key);
      });
      if (changed) { loadUserMetrics().then(draw); loadTable(); }
    };
    ws.onclose = () => { setTimeout(listen, retry); retry = Math.min(retry * 2, 5000); };
  }

  xSel.addEventListener("change", () => { remember(); draw(); });
  aggregate.addEventListener("change", () => { draw(); loadTable(); });
  [targetIn, baselineSel, tableMetric].forEach((e) => e.addEventListener("change", loadTable));
  $("cli-columns").addEventListener("change", () => { if (lastBody) renderTable(lastBody); });
  if (RUNS.length) start();
  else $("compare-runs").textContent = "Select runs on the Runs page to compare them.";
})();
