// Chart tools shared by the run and compare pages: smoothing, a log-scale y axis and linked
// cursors across time-series charts. Plain functions over Plotly traces and layouts, so a page
// keeps its own drawing code and applies these on the way to Plotly.react.
//
//   const T = window.psctlChartTools;
//   T.smooth([1, 5, 2], 0.6)                    -> debiased EMA, nulls kept in place
//   T.smoothTraces(traces, 0.6)                 -> each line as a faint raw line + its EMA
//   T.logScale(layout, true)                    -> the layout with a log y axis
//   T.controls(parent, "run", (state) => ...)   -> smoothing slider + log toggle, remembered
//   T.attachLinkedCursor([div1, div2]).add(div3) -> hovering one chart shows the same x on the rest
"use strict";
(() => {
  // TensorBoard's debiased exponential moving average: weight 0 leaves the values as they are,
  // 0.99 is very smooth; the debiasing keeps the first points from being pulled towards 0.
  // Gaps (null, undefined, NaN) stay gaps and do not reset the average.
  function smooth(values, weight) {
    const w = Number(weight);
    if (!(w > 0)) return values.slice();
    if (!(w < 1)) throw new RangeError(`smoothing weight must be in [0, 1), not ${weight}`);
    let last = 0, n = 0;
    return values.map((y) => {
      if (y === null || y === undefined || Number.isNaN(+y)) return null;
      last = last * w + (1 - w) * +y; n += 1;
      return last / (1 - Math.pow(w, n));
    });
  }

  // Points that share an x (a min/max envelope draws each bucket's minimum then its maximum at
  // the bucket's x) as one point at their mean, so that the smoothed line follows the middle.
  function meanPerX(xs, ys) {
    const x = [], y = [];
    for (let i = 0; i < xs.length;) {
      let j = i, sum = 0, n = 0;
      for (; j < xs.length && xNumber(xs[j]) === xNumber(xs[i]); j++) {
        if (ys[j] !== null && ys[j] !== undefined && !Number.isNaN(+ys[j])) { sum += +ys[j]; n += 1; }
      }
      if (j === i) j = i + 1;  // an x that is not a number: a point of its own
      x.push(xs[i]); y.push(n ? sum / n : null);
      i = j;
    }
    return [x, y];
  }

  // Each line trace (scatter with "lines" in its mode) becomes two: the raw values faint and
  // without hover or legend entry, then the smoothed line in the trace's own style. Other traces
  // (bars, markers-only) pass through. A trace can opt out with `meta: {smooth: false}`; one
  // with `meta: {envelope: true}` (a min/max band) is smoothed through its per-x means.
  function smoothTraces(traces, weight) {
    if (!(Number(weight) > 0)) return traces;
    const out = [];
    for (const t of traces) {
      const isLine = (t.type === undefined || t.type === "scatter" || t.type === "scattergl")
        && String(t.mode || "lines").includes("lines") && Array.isArray(t.y);
      const meta = t.meta || {};
      if (!isLine || meta.smooth === false) { out.push(t); continue; }
      const group = t.legendgroup || t.name;
      out.push(Object.assign({}, t, { showlegend: false, hoverinfo: "skip", hovertemplate: undefined,
        opacity: 0.25, legendgroup: group, meta: Object.assign({}, meta, { raw: true }) }));
      const [x, y] = meta.envelope ? meanPerX(t.x, t.y) : [t.x, t.y];
      out.push(Object.assign({}, t, { x, y: smooth(y, weight), legendgroup: group,
        meta: Object.assign({}, meta, { smoothed: weight }) }));
    }
    return out;
  }

  // The layout with its y axis on a log scale (or back on a linear one). Non-positive values
  // cannot be drawn on a log axis: Plotly leaves them out, so the axis title says so.
  function logScale(layout, on) {
    const y = Object.assign({}, layout.yaxis || {});
    if (on) {
      y.type = "log"; delete y.rangemode;
      const title = (y.title && y.title.text) || "";
      if (title && !title.endsWith("(log)")) y.title = Object.assign({}, y.title, { text: `${title} (log)` });
    } else {
      y.type = "linear";
    }
    return Object.assign({}, layout, { yaxis: y });
  }

  // Smoothing and log-scale controls, kept per page in localStorage so a reload keeps them.
  // onChange(state) runs after each change with {smoothing: 0..0.99, log: bool}.
  function controls(parent, key, onChange) {
    const storeKey = `psctl.chartTools.${key}`;
    let state = { smoothing: 0, log: false };
    try { state = Object.assign(state, JSON.parse(localStorage.getItem(storeKey) || "{}")); } catch (e) { /* a bad entry: defaults */ }
    state.smoothing = Math.min(0.99, Math.max(0, Number(state.smoothing) || 0));
    state.log = state.log === true;
    const box = document.createElement("span");
    box.className = "chart-tools";
    const sLabel = document.createElement("label");
    const slider = Object.assign(document.createElement("input"),
      { type: "range", min: "0", max: "0.99", step: "0.01", value: String(state.smoothing), id: `${key}-smoothing` });
    slider.setAttribute("aria-label", "smoothing (exponential moving average weight)");
    const shown = document.createElement("output");
    shown.textContent = state.smoothing.toFixed(2);
    sLabel.append("smoothing ", slider, " ", shown);
    const lLabel = document.createElement("label");
    const log = Object.assign(document.createElement("input"), { type: "checkbox", checked: state.log, id: `${key}-log` });
    lLabel.append(log, " log scale");
    box.append(sLabel, " ", lLabel);
    parent.appendChild(box);
    const save = () => { try { localStorage.setItem(storeKey, JSON.stringify(state)); } catch (e) { /* private mode */ } };
    slider.addEventListener("input", () => { shown.textContent = Number(slider.value).toFixed(2); });
    // Redrawn on release ("change"), not on every step of the drag: each redraw costs.
    slider.addEventListener("change", () => { state.smoothing = Number(slider.value); save(); onChange(state); });
    log.addEventListener("change", () => { state.log = log.checked; save(); onChange(state); });
    return { state: () => Object.assign({}, state), element: box };
  }

  // x values as numbers: Plotly's date strings ("2024-05-01 12:00:03.25", local time, as it
  // writes Date objects), Date objects, or numbers.
  function xNumber(v) {
    if (v instanceof Date) return v.getTime();
    if (typeof v === "number") return v;
    if (typeof v === "string") {
      const m = /^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d(?::\d\d)?)(\.\d{1,3})?\d*$/.exec(v);
      if (m) return Date.parse(`${m[1]}T${m[2]}${m[3] || ""}`);
      const n = Number(v);
      return Number.isNaN(n) ? Date.parse(v) : n;
    }
    return NaN;
  }

  // For each line/marker trace of a drawn chart, its point nearest to x, when that point is
  // within `tolerance` (a share of the chart's x span): [{curveNumber, pointNumber}, ...].
  function pointsAt(div, x, tolerance) {
    const data = div.data || [];
    let lo = Infinity, hi = -Infinity;
    const xs = data.map((t) => {
      if (!Array.isArray(t.x) || (t.type && t.type !== "scatter" && t.type !== "scattergl")
        || t.visible === false || t.visible === "legendonly" || t.hoverinfo === "skip") return null;
      const v = t.x.map(xNumber);
      v.forEach((n) => { if (Number.isFinite(n)) { lo = Math.min(lo, n); hi = Math.max(hi, n); } });
      return v;
    });
    const reach = Number.isFinite(hi - lo) && hi > lo ? (hi - lo) * tolerance : Infinity;
    const out = [];
    xs.forEach((v, curveNumber) => {
      if (!v) return;
      let best = -1, dist = Infinity;
      v.forEach((n, i) => {
        const y = data[curveNumber].y ? data[curveNumber].y[i] : 0;
        if (y === null || y === undefined) return;
        const d = Math.abs(n - x);
        if (d < dist) { dist = d; best = i; }
      });
      if (best >= 0 && dist <= reach) out.push({ curveNumber, pointNumber: best });
    });
    return out;
  }

  // Hovering a point on one chart shows the hover labels at the same x on the others (the
  // charts must share an x axis kind: all seconds, all dates or all iterations; a chart whose
  // data-x-kind attribute differs from the hovered one's is left alone). Returns a group:
  // group.add(div) links one more chart, and may be called after every draw (a div is linked
  // once, as soon as Plotly has drawn it: Plotly gives it .on() then, and Plotly.react keeps
  // the listeners); group.detach() unlinks them all.
  function attachLinkedCursor(divs, opts) {
    const tolerance = (opts && opts.tolerance) || 0.05;
    const list = [], handlers = [];
    let busy = false;
    function onHoverOf(div) {
      return (ev) => {
        if (busy || !ev || !ev.points || !ev.points.length) return;
        const p = ev.points[0];
        const raw = p.data && Array.isArray(p.data.x) && typeof p.pointNumber === "number" ? p.data.x[p.pointNumber] : p.x;
        const x = xNumber(raw);
        if (!Number.isFinite(x)) return;
        busy = true;  // Plotly's Fx.hover emits no event when called from code; this is a guard
        try {
          for (const other of list) {
            if (other === div || !other.data || !other._fullLayout || other.offsetParent === null) continue;
            // Charts against another kind of x (iterations beside seconds) are not linked.
            if (div.dataset.xKind && other.dataset.xKind && other.dataset.xKind !== div.dataset.xKind) continue;
            const pts = pointsAt(other, x, tolerance);
            if (pts.length) Plotly.Fx.hover(other, pts); else Plotly.Fx.unhover(other);
          }
        } finally { busy = false; }
        list.forEach((d) => { d.dataset.linkedX = String(x); });
      };
    }
    function onUnhoverOf(div) {
      return () => {
        if (busy) return;
        for (const other of list) if (other !== div && other._fullLayout) Plotly.Fx.unhover(other);
      };
    }
    function add(div) {
      if (!div || list.includes(div) || typeof div.on !== "function") return group;
      const h = onHoverOf(div), u = onUnhoverOf(div);
      div.on("plotly_hover", h);
      div.on("plotly_unhover", u);
      list.push(div); handlers.push([div, h, u]);
      return group;
    }
    function detach() {
      handlers.forEach(([div, h, u]) => {
        if (div.removeListener) { div.removeListener("plotly_hover", h); div.removeListener("plotly_unhover", u); }
      });
      list.length = 0; handlers.length = 0;
    }
    const group = { add, detach, divs: list };
    (divs || []).forEach(add);
    return group;
  }

  window.psctlChartTools = { smooth, smoothTraces, meanPerX, logScale, controls, attachLinkedCursor,
    pointsAt, xNumber };
})();
