// The runs page: the list refreshed every 2 s, filters, and a selection to compare.
"use strict";
(() => {
  const body = document.querySelector("#runs-table tbody");
  const statusSel = document.getElementById("status-filter");
  const syncSel = document.getElementById("sync-filter");
  const button = document.getElementById("compare-button");
  const chosen = new Set();
  let runs = [];

  async function load() {
    const q = statusSel.value ? `?status=${encodeURIComponent(statusSel.value)}` : "";
    const res = await fetch("/api/runs" + q);
    runs = res.ok ? await res.json() : [];
    const syncs = [...new Set(runs.map((r) => r.sync))].sort();
    const keep = syncSel.value;
    syncSel.replaceChildren(PS.el("option", { value: "" }, "all"), ...syncs.map((s) => PS.el("option", { value: s }, s)));
    syncSel.value = syncs.includes(keep) ? keep : "";
    draw();
  }

  function draw() {
    const shown = runs.filter((r) => !syncSel.value || r.sync === syncSel.value);
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

  statusSel.addEventListener("change", load);
  syncSel.addEventListener("change", draw);
  button.addEventListener("click", () => { location.href = "/compare?runs=" + [...chosen].join(","); });
  load();
  setInterval(load, 2000);
})();
