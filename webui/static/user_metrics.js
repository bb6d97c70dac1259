// The run page's charts of the metrics the run's own code logged (psctl.log): one chart per
// name, a line per worker and one for the evaluator, on the page's x-axis choice. Kept apart
// from run.js: it reads its own endpoint, /api/runs/RUN/user-metrics, again every few seconds
// while the run is live and the tab is shown, and draws once plotly.js (which run.js loads)
// is there.
"use strict";
(() => {
  const RUN = window.PSCTL_RUN;
  const box = document.getElementById("user-metrics");
  if (!RUN || !box) return;
  const url = `/api/runs/${RUN}/user-metrics`;
  // Live runs only, and never sooner than 20 times what the last answer took: the server's
  // cost stays under a twentieth of a core even for a run of a million logged values.
  const REFRESH_MS = 5000, COST_SHARE = 20;
  const PLOTLY_WAIT_MS = 60000;
  const xSel = document.getElementById("x-axis");
  const cards = new Map();  // metric name -> PS.card, in the order the names first came
  const probe = window.__psctlUserMetrics = { fetches: 0, drawn: [] };
  let data = null, timer = null, busy = false, failures = 0, waited = 0;

  async function refresh() {
    timer = null;
    if (busy) return;
    busy = true;
    const began = performance.now();
    let took = 0;
    try {
      const reply = await fetch(url, { headers: { Accept: "application/json" } });
      if (!reply.ok) throw new Error(`HTTP ${reply.status}`);
      data = await reply.json();
      took = performance.now() - began;
      probe.fetches += 1;
      draw();
    } catch (err) {  // the run page itself says what is wrong with the run or the server
      failures += 1;
      probe.error = String(err);
    } finally {
      busy = false;
      const live = data ? data.status === "running" : failures < 5;
      if (live && document.visibilityState === "visible") {
        timer = setTimeout(refresh, Math.max(REFRESH_MS, COST_SHARE * took));
      }
    }
  }

  function draw() {
    if (!data) return;
    box.hidden = data.metrics.length === 0;
    if (typeof Plotly === "undefined") {  // run.js loads it after its first paint
      if (waited < PLOTLY_WAIT_MS) { waited += 250; setTimeout(draw, 250); }
      return;
    }
    const mode = xSel ? xSel.value : "elapsed";
    data.metrics.forEach(({ name, series }) => {
      if (!cards.has(name)) {
        const card = PS.card(box, `user-${cards.size}`, [["JSON", url]]);
        card.div.dataset.metric = name;
        cards.set(name, card);
      }
      const card = cards.get(name);
      let shown = 0, rows = 0;
      const traces = series.map((s) => {
        const evaluator = s.role === "evaluator";
        shown += s.value.length; rows += s.rows;
        return { type: "scatter", mode: evaluator ? "lines+markers" : "lines",
          name: evaluator ? "evaluator (per evaluation)" : `worker ${s.rank}`,
          line: { color: PS.color(evaluator ? 9 : s.rank), width: evaluator ? 2 : 1.3 },
          x: s.at.map((t, i) => PS.x(mode, t, data.clock, s.iteration[i], data.started_at)), y: s.value };
      });
      const downsampled = rows > shown ? " (mean per run of iterations)" : "";
      const layout = PS.layout(`${name}: logged by the model${downsampled}`, mode, name);
      layout.yaxis = Object.assign({}, layout.yaxis, { rangemode: "normal" });  // any sign
      PS.draw(card.div, ...styled(traces, layout));
      PS.setCount(card, shown, rows, rows > shown ? "logged values" : "");
      if (!probe.drawn.includes(name)) probe.drawn.push(name);
    });
    document.body.dataset.userMetrics = String(probe.drawn.length);
  }

  // The page's smoothing and log-scale controls (chart_tools.js, where the page has them)
  // apply here too: read from their inputs, so that this file needs nothing of run.js.
  const tools = window.psctlChartTools;
  const smoothing = document.getElementById("run-smoothing"), logScale = document.getElementById("run-log");
  function styled(traces, layout) {
    if (!tools) return [traces, layout];
    const weight = smoothing ? Number(smoothing.value) : 0;
    return [tools.smoothTraces(traces, weight), logScale && logScale.checked ? tools.logScale(layout, true) : layout];
  }

  [xSel, smoothing, logScale].forEach((input) => { if (input) input.addEventListener("change", draw); });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && timer === null && data && data.status === "running") refresh();
  });
  refresh();
})();
