// The compare page: one metric of several runs overlaid (a group of repeated runs as its mean
// with a ± standard deviation band), then the metrics table `psctl compare` prints.
"use strict";
(() => {
  const RUNS = window.PSCTL_RUNS;
  // key: [title, series column, scale, unit, evaluation?]. Evaluations are sparse (one point
  // every few seconds), so they are drawn as markers of the raw values and never smoothed by
  // default: an EMA over a handful of points lags far behind them.
  const METRICS = {
    accuracy: ["Test accuracy", "accuracy", 100, "accuracy (%)", true],
    test_loss: ["Test loss", "loss", 1, "cross-entropy", true],
    throughput: ["Throughput (all workers)", "throughput", 1, "samples/s", false],
    loss: ["Training loss (max per bucket)", "loss_max", 1, "cross-entropy", false],
    staleness: ["Staleness (max per bucket)", "staleness_max", 1, "updates since the pull", false],
    idle_fraction: ["Idle fraction (all workers)", "idle_fraction", 100, "idle (% of wall time)", false],
    bytes_sent: ["Bytes sent (all workers)", "sent_per_s", 1, "bytes/s", false],
    bytes_received: ["Bytes received (all workers)", "received_per_s", 1, "bytes/s", false],
  };
  const $ = (id) => document.getElementById(id);
  const metricSel = $("metric"), xSel = $("x-axis"), smooth = $("smooth"), weight = $("weight");
  const aggregate = $("aggregate"), targetIn = $("target"), baselineSel = $("baseline");
  const div = $("compare-chart"), count = $("compare-count"), note = $("table-note");
  Object.entries(METRICS).forEach(([k, v]) => metricSel.appendChild(PS.el("option", { value: k }, v[0])));
  const cache = new Map();
  // The user's smoothing choice per metric; until one is made, the metric's default applies.
  const smoothChoice = new Map();
  let runs = [];  // {id, name, sync, group, ...} from /api/compare, in RUNS order
  const byId = new Map();

  const isEval = (metric) => METRICS[metric][4];
  function applySmoothDefault() {
    const m = metricSel.value;
    smooth.checked = smoothChoice.has(m) ? smoothChoice.get(m) : !isEval(m);
    weight.disabled = !smooth.checked;
  }

  async function fetchJSON(url) {
    const r = await fetch(url);
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.detail || `${r.status} ${r.statusText}`);
    return body;
  }
  function fetchSeries(run, metric) {
    const key = run + "/" + metric;
    if (!cache.has(key)) cache.set(key, fetchJSON(`/api/runs/${run}/series/${metric}`));
    return cache.get(key);
  }

  // Groups of at least two of the compared runs (launch --repeat tags each with its group).
  function groups() {
    const g = new Map();
    runs.forEach((r) => { if (r.group !== null) g.set(r.group, [...(g.get(r.group) || []), r.id]); });
    return new Map([...g].filter(([, ids]) => ids.length >= 2));
  }

  // A run's points as numbers (wall time in ms), sorted by x, without gaps.
  function points(body, col, scale, mode) {
    const s = body.series.all || { t: [], elapsed_s: [], iteration: [] };
    const xs = mode === "wall" ? s.t.map((t) => t * 1000) : mode === "iteration" ? s.iteration : s.elapsed_s;
    const ys = s[col] || [];
    const pts = [];
    xs.forEach((x, i) => {
      const y = ys[i];
      if (x !== null && y !== null && y !== undefined && Number.isFinite(y)) pts.push([x, y * scale]);
    });
    return pts.sort((a, b) => a[0] - b[0]);
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
  function band(series) {
    if (series.some((p) => p.length === 0)) return null;
    const lo = Math.max(...series.map((p) => p[0][0])), hi = Math.min(...series.map((p) => p[p.length - 1][0]));
    if (lo > hi) return null;
    let grid = [...new Set(series.flatMap((p) => p.map((q) => q[0])).filter((x) => x >= lo && x <= hi))]
      .sort((a, b) => a - b);
    if (grid.length > GRID_POINTS) {
      grid = Array.from({ length: GRID_POINTS }, (_, i) => lo + (hi - lo) * i / (GRID_POINTS - 1));
    }
    const n = series.length, mean = [], std = [];
    grid.forEach((x) => {
      const v = series.map((p) => interp(p, x)), m = v.reduce((a, b) => a + b, 0) / n;
      mean.push(m);
      std.push(Math.sqrt(v.reduce((a, b) => a + (b - m) ** 2, 0) / (n - 1)));
    });
    return { x: grid, mean, std };
  }

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  function runTraces(run, pts, i, metric, mode) {
    const color = PS.color(i), x = toX(mode, pts.map((p) => p[0])), y = pts.map((p) => p[1]);
    const ev = isEval(metric);
    const raw = { type: "scatter", name: run.name, x, y, legendgroup: run.id,
      mode: ev ? "lines+markers" : "lines", marker: { size: 6, color }, line: { color, width: 1.5 } };
    if (!smooth.checked) return [raw];
    const w = Math.min(0.999, Math.max(0, Number(weight.value) || 0));
    // The smoothed line is an overlay, dashed and named so; the raw values stay drawn.
    if (!ev) Object.assign(raw, { opacity: 0.35, line: { color, width: 1 } });
    return [raw, { type: "scatter", mode: "lines", name: `${run.name} (EMA ${w})`, x, y: PS.ema(y, w),
      legendgroup: run.id, line: { color, width: 2, dash: "dash" } }];
  }

  function groupTraces(name, ids, b, i, metric, mode) {
    const color = PS.color(i), x = toX(mode, b.x), group = "group:" + name;
    const lower = b.mean.map((m, k) => m - b.std[k]), upper = b.mean.map((m, k) => m + b.std[k]);
    return [
      { type: "scatter", mode: "lines", name: `${name} mean − std`, x, y: lower, legendgroup: group,
        showlegend: false, hoverinfo: "skip", line: { width: 0, color } },
      { type: "scatter", mode: "lines", name: `${name} mean + std`, x, y: upper, legendgroup: group,
        showlegend: false, hoverinfo: "skip", fill: "tonexty", fillcolor: rgba(color, 0.22),
        line: { width: 0, color }, meta: "band" },
      { type: "scatter", name: `${name} (${ids.length} runs, mean ± std)`, x, y: b.mean,
        legendgroup: group, mode: isEval(metric) ? "lines+markers" : "lines",
        marker: { size: 5, color }, line: { color, width: 2.5 } },
    ];
  }

  let drawing = Promise.resolve();
  function draw() { drawing = drawing.then(drawNow, drawNow); return drawing; }
  async function drawNow() {
    const metric = metricSel.value, [title, col, scale, unit] = METRICS[metric], mode = xSel.value;
    let data;
    try {
      data = await Promise.all(RUNS.map((r) => fetchSeries(r, metric)));
    } catch (e) {
      count.textContent = `could not load the series: ${e.message}`;
      return;
    }
    const pts = new Map(RUNS.map((r, i) => [r, points(data[i], col, scale, mode)]));
    const traces = [], notes = [];
    const shownGroups = aggregate.checked ? groups() : new Map();
    const banded = new Set();
    let colorIndex = 0;
    shownGroups.forEach((ids, name) => {
      const b = band(ids.map((id) => pts.get(id)));
      if (b === null) { notes.push(`group ${name}: its runs share no x range (or one has no points), drawn one by one`); return; }
      traces.push(...groupTraces(name, ids, b, colorIndex++, metric, mode));
      ids.forEach((id) => banded.add(id));
    });
    RUNS.forEach((id) => {
      if (banded.has(id)) return;
      const run = byId.get(id) || { id, name: id.slice(0, 8) };
      traces.push(...runTraces(run, pts.get(id), colorIndex++, metric, mode));
    });
    const layout = PS.layout(title, mode, unit, {
      // Below the plot, and counted in the figure's height, so it never spills out of the box.
      legend: { orientation: "h", yref: "container", y: 0, yanchor: "bottom", x: 0, font: { size: 11 } },
      margin: { l: 58, r: 12, t: 34, b: 8 },
      xaxis: { title: { text: PS.xTitle[mode] || mode }, automargin: true, type: mode === "wall" ? "date" : "linear" },
    });
    PS.draw(div, traces, layout);
    const shown = data.reduce((a, d) => a + d.points_shown, 0), total = data.reduce((a, d) => a + d.points_total, 0);
    if (banded.size) notes.push("a group is its mean ± sample standard deviation, interpolated over the x range all its runs cover");
    if (smooth.checked) notes.push(`EMA weight ${weight.value}, dashed, over the raw values`);
    count.textContent = [`showing ${shown.toLocaleString()} of ${total.toLocaleString()} points`, ...notes].join("; ");
    div.dataset.points = String(shown);
    div.dataset.drawn = "1";
    div.dataset.draws = String(Number(div.dataset.draws || 0) + 1);
    markPainted();
  }

  // -- the metrics table: what `psctl compare --json` prints, formatted as its terminal table --
  const NUMERIC = (kind) => !["text", "config", "flag"].includes(kind);
  let tableSeq = 0;
  function tableParams() {
    const p = new URLSearchParams({ runs: RUNS.join(",") });
    const t = Number(targetIn.value);
    if (!(targetIn.value !== "" && t > 0 && t <= 1)) throw new Error("the target accuracy is a number in (0, 1]");
    p.set("target", String(t));
    if (baselineSel.value) p.set("baseline", baselineSel.value);
    // Groups shown as one band are one row too; unaggregated, a row per run (--per-run).
    if (!aggregate.checked) p.set("per_run", "true");
    return p;
  }
  function cliCommand(p) {
    const sel = RUNS.map((r) => r.slice(0, 8)).join(" ");
    return `psctl compare ${sel} --target ${p.get("target")}` + (p.get("baseline") ? ` --baseline ${p.get("baseline").slice(0, 8)}` : "")
      + (p.get("per_run") ? " --per-run" : "");
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
    renderTable(body);
    $("compare-table").dataset.seq = String(seq);
    return body;
  }

  function renderTable(body) {
    const table = $("compare-table"), cols = body.columns.filter((c) => c.kind !== "std" && c.kind !== "ci");
    const grouped = body.columns.some((c) => c.kind === "std");
    note.textContent = `${body.rows.length} ${grouped ? "row" : "run"}(s)` +
      (grouped ? "; a group of repeated runs shows mean ± standard deviation (a speedup paired by seed: its 95 % interval)" : "") +
      (body.target !== null ? `; time to target: to ${(100 * body.target).toFixed(1)} % test accuracy` : "") +
      "; the best value of each column is bold";
    const head = PS.el("tr");
    cols.forEach((c) => head.appendChild(PS.el("th", { class: NUMERIC(c.kind) ? "num" : "", title: c.key }, c.header)));
    const tbody = PS.el("tbody");
    body.rows.forEach((row, i) => {
      const tr = PS.el("tr", { "data-id": String(row.id) });
      cols.forEach((c) => {
        const text = body.cells[i][c.key], cls = [];
        if (NUMERIC(c.kind)) cls.push("num");
        if (c.key in body.best && row[c.key] === body.best[c.key]) cls.push("best");
        if (c.key === "status") cls.push("status", String(row.status));
        const td = PS.el("td", { class: cls.join(" "), "data-key": c.key });
        if (c.key === "id" && byId.has(row.id)) td.appendChild(PS.el("a", { href: `/runs/${row.id}`, title: row.id }, text));
        else if (c.key === "id" && row.runs > 1) {
          td.classList.add("group");
          td.appendChild(PS.el("a", { href: `/compare?group=${encodeURIComponent(row.id)}` }, text));
        } else td.textContent = text;
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    const thead = PS.el("thead");
    thead.appendChild(head);
    table.replaceChildren(thead, tbody);
    table.dataset.loaded = "1";
    markPainted();
  }

  function markPainted() {
    if (div.dataset.drawn === "1" && $("compare-table").dataset.loaded) document.body.dataset.painted = "1";
  }

  function describeRuns() {
    $("compare-runs").textContent = runs.map((r) =>
      `${r.name} (${r.sync}, ${r.workers}×${r.servers}${r.group !== null ? `, group ${r.group}` : ""})`).join(" · ");
  }

  async function start() {
    applySmoothDefault();
    let body;
    try {
      // Per run (per_run): the runs' names and groups, whatever the aggregation.
      body = await fetchJSON(`/api/compare?${new URLSearchParams({ runs: RUNS.join(","), per_run: "true" })}`);
    } catch (e) {
      $("compare-runs").textContent = `could not load the runs: ${e.message}`;
      return;
    }
    runs = body.runs;
    runs.forEach((r) => byId.set(r.id, r));
    runs.forEach((r) => baselineSel.appendChild(PS.el("option", { value: r.id }, r.name)));
    describeRuns();
    if (groups().size) { $("aggregate-label").hidden = false; aggregate.checked = true; }
    await Promise.all([draw(), loadTable()]);
    listen();
  }

  // Live: the runs list is pushed over a websocket; when a compared run has new iterations,
  // evaluations or a new status, its series are fetched again, the chart redrawn and the
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
      if (changed) { draw(); loadTable(); }
    };
    ws.onclose = () => { setTimeout(listen, retry); retry = Math.min(retry * 2, 5000); };
  }

  metricSel.addEventListener("change", () => { applySmoothDefault(); draw(); });
  smooth.addEventListener("change", () => { smoothChoice.set(metricSel.value, smooth.checked); weight.disabled = !smooth.checked; draw(); });
  [xSel, weight].forEach((e) => e.addEventListener("change", draw));
  aggregate.addEventListener("change", () => { draw(); loadTable(); });
  [targetIn, baselineSel].forEach((e) => e.addEventListener("change", loadTable));
  if (RUNS.length) start();
  else {
    applySmoothDefault();
    $("compare-runs").textContent = "Select runs on the Runs page to compare them.";
  }
})();
