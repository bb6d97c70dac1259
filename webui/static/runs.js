// The runs page: the list pushed over a websocket whenever it changes, filters, and a selection
// to compare.
"use strict";
(() => {
  const body = document.querySelector("#runs-table tbody");
  const statusSel = document.getElementById("status-filter");
  const syncSel = document.getElementById("sync-filter");
  const button = document.getElementById("compare-button");
  const chosen = new Set();
  let runs = [];

  // Every run arrives (the list is small); the status filter is applied here, on the effective
  // status the server computed, so a run that crashes moves between filters by itself.
  function receive(all) {
    runs = all;
    const syncs = [...new Set(runs.map((r) => r.sync))].sort();
    const keep = syncSel.value;
    syncSel.replaceChildren(PS.el("option", { value: "" }, "all"), ...syncs.map((s) => PS.el("option", { value: s }, s)));
    syncSel.value = syncs.includes(keep) ? keep : "";
    draw();
  }

  let retry = 500;
  function connect() {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/runs`);
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data); retry = 500;
      if (m.type === "runs") receive(m.runs);
      else if (m.type === "error") { document.getElementById("runs-empty").textContent = m.message; receive([]); }
      document.body.dataset.live = "1";
    };
    ws.onclose = () => { setTimeout(connect, retry); retry = Math.min(retry * 2, 5000); };
  }

  function draw() {
    const shown = runs.filter((r) => (!syncSel.value || r.sync === syncSel.value) && (!statusSel.value || r.status === statusSel.value));
    document.getElementById("runs-empty").hidden = shown.length > 0;
    body.replaceChildren(...shown.map((r) => {
      const tr = document.createElement("tr");
      const box = PS.el("input", { type: "checkbox", "aria-label": "select " + r.name });
      box.checked = chosen.has(r.id);
      box.addEventListener("change", () => { box.checked ? chosen.add(r.id) : chosen.delete(r.id); button.disabled = chosen.size === 0; });
      const link = PS.el("a", { href: "/runs/" + r.id }, r.name);
      const cells = [PS.el("td"), PS.el("td", { class: "status " + r.status }, r.status), PS.el("td"), PS.el("td", {}, r.sync),
        PS.el("td", {}, `${r.workers} × ${r.servers}`), PS.el("td", {}, r.dataset), PS.el("td", {}, PS.pct(r.best_accuracy)),
        PS.el("td", {}, PS.fmtS(r.duration_s)), PS.el("td", {}, new Date(r.started_at * 1000).toLocaleString())];
      cells[0].appendChild(box); cells[2].appendChild(link);
      tr.append(...cells);
      return tr;
    }));
  }

  statusSel.addEventListener("change", draw);
  syncSel.addEventListener("change", draw);
  button.addEventListener("click", () => { location.href = "/compare?runs=" + [...chosen].join(","); });
  connect();
})();
