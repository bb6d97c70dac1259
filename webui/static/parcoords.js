// A group of runs (a study, a sweep, the seeds of `launch --repeat`) as parallel coordinates:
// an axis for each setting that varies between its runs (as /api/table?group_by= lists them)
// and one for each outcome, a line per run coloured by its final accuracy. Plotly's parcoords
// trace; plotly.js is loaded on first use, so the runs table itself paints without it.
"use strict";
window.PSParcoords = (() => {
  let loading = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve();
    if (!loading) {
      loading = new Promise((resolve, reject) => {
        const s = document.createElement("script");
        s.src = window.PSCTL_PLOTLY || "/vendor/plotly.min.js";
        s.onload = () => resolve();
        s.onerror = () => { loading = null; reject(new Error("could not load plotly.js")); };
        document.head.appendChild(s);
      });
    }
    return loading;
  }

  const round = (v) => Number(v.toPrecision(3));
  // A numeric axis. Runs without a value (a target never reached) sit on a tick of their own
  // beyond the range, named `missing`: parcoords has no gaps, and leaving them out would hide
  // exactly the runs that did worst.
  function numeric(label, values, missing) {
    const present = values.filter((v) => v !== null && v !== undefined);
    if (!present.length) return { label, values: values.map(() => 0), range: [-1, 1], tickvals: [0], ticktext: [missing] };
    const lo = Math.min(...present), hi = Math.max(...present);
    if (present.length === values.length) return { label, values, range: lo === hi ? [lo - 1, hi + 1] : [lo, hi] };
    const span = hi - lo || Math.abs(hi) || 1, slot = hi + span * 0.25;
    const ticks = lo === hi ? [lo] : [0, 1, 2, 3].map((k) => round(lo + (hi - lo) * k / 3));
    return { label, values: values.map((v) => v === null || v === undefined ? slot : v), range: [Math.min(lo, ...ticks), slot],
      tickvals: [...ticks, slot], ticktext: [...ticks.map(String), missing] };
  }
  // Anything else (a sync model, true/false, a list): one tick per distinct value, in order.
  function categorical(label, values) {
    const text = values.map((v) => v === null || v === undefined ? "–" : typeof v === "string" ? v : JSON.stringify(v));
    const names = [...new Set(text)].sort();
    return { label, values: text.map((t) => names.indexOf(t)), tickvals: names.map((_, i) => i), ticktext: names,
      range: names.length > 1 ? [0, names.length - 1] : [-1, 1] };
  }
  function axis(label, values, missing) {
    const nums = values.every((v) => v === null || v === undefined || (typeof v === "number" && Number.isFinite(v)));
    return nums ? numeric(label, values, missing) : categorical(label, values);
  }

  // rows: /api/table rows of one group; group: its /api/table `groups` entry; target: the
  // table's target accuracy (0-1]. Returns a promise of the number of axes drawn.
  async function draw(div, rows, group, target) {
    await loadPlotly();
    const dims = [
      ...group.varying.map((key) => axis(key, rows.map((r) => (r.config || {})[key]), "–")),
      axis("final acc (%)", rows.map((r) => r.values.final_accuracy === null ? null : 100 * r.values.final_accuracy), "none"),
      axis(`to ${+(100 * target).toFixed(2)} % (s)`, rows.map((r) => r.values.time_to_target_s), "not reached"),
      axis("samples/s", rows.map((r) => r.values.samples_per_s), "none"),
    ];
    const acc = rows.map((r) => r.values.final_accuracy === null ? null : 100 * r.values.final_accuracy);
    const colored = acc.some((a) => a !== null);
    const line = colored
      ? { color: acc.map((a) => a === null ? Math.min(...acc.filter((v) => v !== null)) : a), colorscale: "Viridis", showscale: true,
          colorbar: { title: { text: "final acc (%)", side: "right" }, thickness: 12 } }
      : { color: PS.color(0) };
    const trace = { type: "parcoords", line, dimensions: dims, labelangle: -12, labelside: "top",
      labelfont: { size: 11 }, tickfont: { size: 10 }, rangefont: { size: 9 } };
    Plotly.react(div, [trace], { margin: { l: 70, r: 70, t: 56, b: 24 }, height: 300 }, { displaylogo: false, responsive: true });
    div.dataset.axes = String(dims.length);
    return dims.length;
  }

  return { draw, loadPlotly };
})();
