// The compare page: one metric of several runs overlaid, optional debiased EMA smoothing.
"use strict";
(() => {
  const RUNS = window.PSCTL_RUNS;
  const METRICS = { accuracy: ["Test accuracy", "accuracy", 100, "accuracy (%)"], test_loss: ["Test loss", "loss", 1, "cross-entropy"],
    throughput: ["Throughput (all workers)", "throughput", 1, "samples/s"], loss: ["Training loss (max per bucket)", "loss_max", 1, "cross-entropy"],
    staleness: ["Staleness (max per bucket)", "staleness_max", 1, "updates"], idle_fraction: ["Idle fraction (all workers)", "idle_fraction", 100, "idle (% of wall time)"],
    bytes_sent: ["Bytes sent (all workers)", "sent_per_s", 1, "bytes/s"], bytes_received: ["Bytes received (all workers)", "received_per_s", 1, "bytes/s"] };
  const metricSel = document.getElementById("metric"), xSel = document.getElementById("x-axis");
  const smooth = document.getElementById("smooth"), weight = document.getElementById("weight");
  Object.entries(METRICS).forEach(([k, v]) => metricSel.appendChild(PS.el("option", { value: k }, v[0])));
  const div = document.getElementById("compare-chart"), count = document.getElementById("compare-count");
  const cache = new Map();

  async function fetchSeries(run, metric) {
    const key = run + "/" + metric;
    if (!cache.has(key)) cache.set(key, fetch(`/api/runs/${run}/series/${metric}`).then((r) => r.json()));
    return cache.get(key);
  }

  async function draw() {
    const metric = metricSel.value, [title, col, scale, unit] = METRICS[metric], mode = xSel.value;
    const names = await Promise.all(RUNS.map((r) => fetch(`/api/runs?limit=1000`).then((x) => x.json()).then((all) => all.find((a) => a.id === r))));
    document.getElementById("compare-runs").textContent = names.map((n) => n ? `${n.name} (${n.sync}, ${n.workers}×${n.servers})` : "?").join(" · ");
    const data = await Promise.all(RUNS.map((r) => fetchSeries(r, metric)));
    const traces = []; let shown = 0, total = 0;
    data.forEach((d, i) => {
      const s = d.series.all || { t: [], elapsed_s: [], iteration: [] };
      const x = mode === "wall" ? s.t.map((t) => new Date(t * 1000)) : mode === "iteration" ? s.iteration : s.elapsed_s;
      const y = (s[col] || []).map((v) => v === null ? null : v * scale);
      const name = names[i] ? names[i].name : RUNS[i].slice(0, 8);
      const w = Math.min(0.999, Math.max(0, Number(weight.value) || 0));
      if (smooth.checked) {
        traces.push({ type: "scatter", mode: "lines", name: name + " (raw)", x, y, opacity: 0.25, showlegend: false, line: { color: PS.color(i), width: 1 } });
        traces.push({ type: "scatter", mode: "lines", name, x, y: PS.ema(y, w), line: { color: PS.color(i), width: 2 } });
      } else traces.push({ type: "scatter", mode: "lines", name, x, y, line: { color: PS.color(i), width: 1.5 } });
      shown += x.length; total += d.points_total;
    });
    PS.draw(div, traces, PS.layout(title, mode, unit, { height: 480 }));
    count.textContent = `showing ${shown.toLocaleString()} of ${total.toLocaleString()} points` + (smooth.checked ? `; EMA weight ${weight.value}, raw series faint beneath` : "");
    div.dataset.points = String(shown);
    document.body.dataset.painted = "1";
  }

  // Live: the runs list is pushed over a websocket; when a compared run has new iterations,
  // evaluations or a new status, its series are fetched again and the chart redrawn.
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
      if (changed) draw();
    };
    ws.onclose = () => { setTimeout(listen, retry); retry = Math.min(retry * 2, 5000); };
  }

  [metricSel, xSel, smooth, weight].forEach((e) => e.addEventListener("change", draw));
  if (RUNS.length) { draw(); listen(); } else document.getElementById("compare-runs").textContent = "Select runs on the Runs page to compare them.";
})();
