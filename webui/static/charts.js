// Shared chart helpers: one place decides titles, axis labels, units and x-axis choice.
"use strict";
const PS = {};
PS.palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
PS.color = (i) => PS.palette[((i % PS.palette.length) + PS.palette.length) % PS.palette.length];
PS.xTitle = { elapsed: "training time (s, from the first iteration)", wall: "wall time", iteration: "iteration" };
// The one time base of every view (engine/db/clock.py): seconds of training from the run's
// first iteration, a resumed run's downtime left out (a moment inside it reads as where
// training stopped); before the first iteration, in start-up, the seconds still to go,
// negative. `clock` is the server's {first_iteration_at, startup_s, downtime: [{start, end}]};
// `origin` (the run's start) stands in for the first iteration until there is one.
PS.trainingS = (clock, t, origin) => {
  const first = clock && clock.first_iteration_at != null ? clock.first_iteration_at : origin;
  if (t < first) return t - first;
  const spans = (clock && clock.downtime) || [];
  return t - first - spans.reduce((s, d) => s + Math.max(0, Math.min(t, d.end) - Math.max(first, d.start)), 0);
};
// x value of a point: wall time as a Date, seconds of training, or iteration number.
PS.x = (mode, t, clock, it, origin) => mode === "wall" ? new Date(t * 1000)
  : mode === "iteration" ? it : PS.trainingS(clock, t, origin);
PS.layout = (title, xMode, yTitle, extra) => Object.assign({
  title: { text: title, font: { size: 14 }, x: 0.02 },
  margin: { l: 58, r: 12, t: 34, b: 48 },
  xaxis: { title: { text: PS.xTitle[xMode] || xMode }, automargin: true },
  yaxis: { title: { text: yTitle }, automargin: true, rangemode: "tozero" },
  legend: { orientation: "h", y: -0.3, yanchor: "top", font: { size: 11 } },
  hovermode: "closest", uirevision: "keep",
}, extra || {});
PS.config = { responsive: true, displaylogo: false };
// Whether any trace has a value to draw (horizontal bars keep theirs in x).
PS.hasData = (traces) => traces.some((t) => {
  const v = t.orientation === "h" ? t.x : t.y;
  return Array.isArray(v) && v.some((y) => y !== null && y !== undefined && !(typeof y === "number" && Number.isNaN(y)));
});
// A chart with nothing to draw says so, keeping its title and axis titles (what it will show)
// but no ticks, grid or lines: Plotly would otherwise invent a 0-4 range for the empty axes.
// `layout.meta.empty` words the note ("no ElasticBSP barriers in this run"); default "no data".
PS.noData = (layout) => {
  const bare = (axis) => Object.assign({}, axis || {}, { showticklabels: false, showgrid: false,
    zeroline: false, showline: false, ticks: "", range: [0, 1], autorange: false });
  const out = Object.assign({}, layout, { xaxis: bare(layout.xaxis), yaxis: bare(layout.yaxis),
    shapes: [], showlegend: false, annotations: [{ text: (layout.meta && layout.meta.empty) || "no data",
      showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { size: 14, color: "#777" } }] });
  if (out.yaxis2) out.yaxis2 = Object.assign({}, bare(layout.yaxis2), { visible: false });
  return out;
};
PS.draw = (div, traces, layout) => {
  const empty = !PS.hasData(traces);
  div.dataset.empty = empty ? "1" : "0";
  return Plotly.react(div, empty ? [] : traces, empty ? PS.noData(layout) : layout, PS.config);
};
// TensorBoard-style debiased exponential moving average.
PS.ema = (ys, weight) => {
  let last = 0, n = 0;
  return ys.map((y) => {
    if (y === null || y === undefined || Number.isNaN(y)) return null;
    last = last * weight + (1 - weight) * y; n += 1;
    return last / (1 - Math.pow(weight, n));
  });
};
// One duration format everywhere (the CLI's too): H:MM:SS, from the run's ended_at - started_at.
PS.fmtS = (s) => {
  if (s === null || s === undefined || Number.isNaN(s)) return "–";
  const t = Math.round(s), h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60), sec = t % 60;
  return `${h}:${String(m).padStart(2, "0")}:${String(sec).padStart(2, "0")}`;
};
// ISO 8601 dates in the viewer's time zone (the CLI prints the same form), never a locale's.
PS.date = (unixS) => {
  const d = new Date(unixS * 1000), p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
};
PS.pct = (v) => v === null || v === undefined ? "–" : (100 * v).toFixed(2) + " %";
// Binary units, three significant digits, as the CLI prints them (psctl.detail_tables.fmt_bytes).
PS.bytes = (n) => {
  for (const [unit, scale] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (n >= scale) { const v = n / scale; return `${v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${unit}`; }
  }
  return `${n.toFixed(0)} B`;
};
PS.el = (tag, attrs, text) => {
  const e = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => e.setAttribute(k, v));
  if (text !== undefined) e.textContent = text;
  return e;
};
// A chart card: the plot, then "showing N of M points" and download links.
PS.card = (parent, id, downloads) => {
  const box = PS.el("div", { class: "chart-box" });
  const div = PS.el("div", { class: "chart", id: "chart-" + id });
  const count = PS.el("p", { class: "count", id: "count-" + id });
  const span = PS.el("span", { class: "shown" });
  count.appendChild(span);
  (downloads || []).forEach(([label, href]) => count.appendChild(PS.el("a", { href }, label)));
  box.append(div, count); parent.appendChild(box);
  return { div, span };
};
// Bucketed charts summarise raw rows (`what`: iterations) into fewer points, and draw one line
// per worker plus one for all: their point count is not a share of the rows, so say both.
PS.setCount = (card, shown, total, what) => {
  card.span.textContent = what
    ? `showing ${shown.toLocaleString("en-US")} points from ${total.toLocaleString("en-US")} ${what}`
    : `showing ${shown.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} points`;
  card.div.dataset.points = String(shown);
};
