// The runs table: every run with its metrics (GET /api/table, the numbers `psctl compare
// --per-run` prints), sortable, filtered by status, sync model and any config key, grouped by
// any run column, tag or config key (each group collapsible, with its run count and the mean of
// each numeric column; a group of several runs can open a parallel-coordinates view of the
// settings that vary in it, parcoords.js), with tags and notes edited in place (PUT, written by
// the recorder's database API). The websocket /ws/runs says when the list changed; the table is
// then fetched again, at most every few seconds while runs are live.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const body = document.querySelector("#runs-table tbody");
  const statusSel = $("status-filter"), syncSel = $("sync-filter"), whereIn = $("where");
  const targetIn = $("target"), button = $("compare-button"), errorBox = $("table-error");
  const groupSel = $("group-by");
  const LIVE_REFRESH_MS = 5000;
  const chosen = new Set();
  const params = new URLSearchParams(location.search);
  let rows = [], total = 0, editing = 0, dirty = false;
  let sort = { key: params.get("sort") || "started_at", dir: params.get("dir") === "asc" ? 1 : -1 };
  whereIn.value = params.get("where") || "";
  if (params.get("target")) targetIn.value = params.get("target");
  // The key asked for in the address; an option for it exists once the keys are known.
  let wantedGroup = params.get("group_by") || "";
  let grouping = { key: "", groups: [] };  // what the last fetch grouped by, and its groups
  const collapsed = new Set(), openViews = new Set();  // group labels
  const views = new Map();  // group label -> {tr, div, drawn}: kept across redraws

  // -- fetching ---------------------------------------------------------------------------
  let inFlight = null, again = false, timer = null, lastFetch = 0;
  function query() {
    const q = new URLSearchParams();
    whereIn.value.trim().split(/\s+/).filter(Boolean).forEach((c) => q.append("where", c));
    const pct = Number(targetIn.value);
    if (pct > 0 && pct <= 100) q.set("target", String(pct / 100));
    const key = groupSel.value || wantedGroup;
    if (key) q.set("group_by", key);
    return q;
  }
  async function refetch() {
    if (inFlight) { again = true; return inFlight; }
    lastFetch = Date.now();
    inFlight = (async () => {
      try {
        const r = await fetch("/api/table?" + query());
        const data = await r.json();
        if (!r.ok) {
          showError(data.detail || r.statusText);
          // A group key from an old address that no run has any more: the table without it.
          if (wantedGroup) { wantedGroup = ""; again = true; }
          return;
        }
        showError(data.message && data.rows.length === 0 && whereIn.value.trim() ? data.message : "");
        rows = data.rows; total = rows.length;
        grouping = { key: data.group_by || "", groups: data.groups || [], target: data.target };
        fillKeys(data.config_keys); fillSyncs(); fillGroupKeys(data.tag_keys || [], data.config_keys);
        $("target-header").textContent = `To ${+(100 * data.target).toFixed(2)} % (s)`;
        draw();
      } catch (e) { showError("could not load the table: " + e); }
    })();
    await inFlight; inFlight = null;
    if (again) { again = false; refetch(); }
  }
  // Soon after a run starts, ends or is removed; every LIVE_REFRESH_MS while one is running.
  function schedule(soon) {
    const wait = soon ? 200 : Math.max(0, lastFetch + LIVE_REFRESH_MS - Date.now());
    if (timer !== null && !soon) return;
    clearTimeout(timer);
    timer = setTimeout(() => { timer = null; refetch(); }, wait);
  }
  function showError(text) { errorBox.textContent = text; errorBox.hidden = !text; }
  function fillKeys(keys) {
    const list = $("config-keys");
    if (list.children.length === keys.length) return;
    list.replaceChildren(...keys.map((k) => PS.el("option", { value: k + "=" })));
  }
  function fillGroupKeys(tagKeys, configKeys) {
    const fill = (id, keys) => {
      const box = $(id);
      if (box.children.length === keys.length && [...box.children].every((o, i) => o.value === keys[i])) return;
      box.replaceChildren(...keys.map((k) => PS.el("option", { value: k }, k)));
    };
    fill("group-tag-keys", tagKeys);
    fill("group-config-keys", configKeys.filter((k) => k !== "name"));
    if (wantedGroup && [...groupSel.options].some((o) => o.value === wantedGroup)) {
      groupSel.value = wantedGroup;
      wantedGroup = "";
    }
  }
  function fillSyncs() {
    const syncs = [...new Set(rows.map((r) => r.sync))].sort(), keep = syncSel.value;
    syncSel.replaceChildren(PS.el("option", { value: "" }, "all"), ...syncs.map((s) => PS.el("option", { value: s }, s)));
    syncSel.value = syncs.includes(keep) ? keep : "";
  }

  // -- live list --------------------------------------------------------------------------
  let known = "";
  function receive(list) {
    const shape = list.map((r) => r.id + ":" + r.status).join(",");
    const byId = new Map(list.map((r) => [r.id, r]));
    rows.forEach((row) => {  // a live run's duration and accuracy, without waiting for a fetch
      const live = byId.get(row.id);
      if (!live) return;
      row.status = live.status; row.iterations = live.iterations;
      Object.assign(row.values, { wall_s: live.duration_s, best_accuracy: live.best_accuracy, final_accuracy: live.final_accuracy });
    });
    // The first list only confirms the table fetched at load; a later change means a run
    // started, ended or was removed.
    if (known === "") known = shape;
    else if (shape !== known) { known = shape; schedule(true); }
    else if (list.some((r) => r.status === "running")) schedule(false);
    draw();
  }
  let retry = 500;
  function connect() {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/runs`);
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data); retry = 500;
      if (m.type === "runs") receive(m.runs);
      else if (m.type === "error") { $("runs-empty").textContent = m.message; rows = []; draw(); }
      document.body.dataset.live = "1";
    };
    ws.onclose = () => { setTimeout(connect, retry); retry = Math.min(retry * 2, 5000); };
  }

  // -- drawing ----------------------------------------------------------------------------
  const TEXT_KEYS = new Set(["status", "name", "sync", "dataset"]);
  const value = (r, key) => key in r.values ? r.values[key] : r[key];
  function compareRows(a, b) {
    const x = value(a, sort.key), y = value(b, sort.key);
    const blankX = x === null || x === undefined, blankY = y === null || y === undefined;
    if (blankX || blankY) return blankX - blankY;  // blanks last, whichever the direction
    const c = TEXT_KEYS.has(sort.key) ? String(x).localeCompare(String(y)) : x - y;
    return sort.dir * c || b.started_at - a.started_at;
  }
  function shownRows() {
    return rows.filter((r) => (!syncSel.value || r.sync === syncSel.value) && (!statusSel.value || r.status === statusSel.value))
      .sort(compareRows);
  }
  function draw() {
    if (editing > 0) { dirty = true; return; }  // never redraw under the user's cursor
    dirty = false;
    const shown = shownRows();
    $("runs-empty").hidden = shown.length > 0 || rows.length > 0;
    $("table-count").textContent = rows.length ? `${shown.length} of ${total} runs shown` : "";
    document.querySelectorAll("#runs-table th[data-sort]").forEach((th) => {
      th.setAttribute("aria-sort", th.dataset.sort === sort.key ? (sort.dir > 0 ? "ascending" : "descending") : "none");
    });
    const grouped = grouping.key !== "" && grouping.key === groupSel.value;
    body.replaceChildren(...(grouped ? groupedElements(shown) : shown.map(rowElement)));
    body.dataset.rows = String(shown.length);
    body.dataset.groupedBy = grouped ? grouping.key : "";
  }

  // -- groups -----------------------------------------------------------------------------
  const MEANS = [["final_accuracy", "pct"], ["best_accuracy", "pct"], ["time_to_target_s", "secs"],
    ["startup_s", "secs"], ["samples_per_s", "rate"], ["idle_fraction", "pct"], ["staleness_mean", "num"], ["wall_s", "dur"]];
  // Tags that studies and `launch --repeat` put on their runs: their groups always offer the
  // parallel-coordinates view (any group whose runs differ in a setting does too).
  const STUDY_TAGS = new Set(["tag.study", "tag.study_id", "tag.group"]);
  const shownValue = (v) => v === null || v === undefined ? "(none)" : typeof v === "string" ? v : JSON.stringify(v);
  function byValue(a, b) {
    const x = a.value, y = b.value;
    if (x === null || y === null) return (x === null) - (y === null);
    if (typeof x === "number" && typeof y === "number") return x - y;
    return shownValue(x).localeCompare(shownValue(y), undefined, { numeric: true });
  }
  function groupedElements(shown) {
    const out = [];
    const place = new Map(shown.map((r, i) => [r.id, i]));
    [...grouping.groups].sort(byValue).forEach((g) => {
      const members = g.runs.filter((id) => place.has(id)).sort((a, b) => place.get(a) - place.get(b)).map((id) => shown[place.get(id)]);
      if (!members.length) return;
      out.push(groupHeader(g, members));
      if (openViews.has(g.label)) out.push(viewRow(g, members));
      if (!collapsed.has(g.label)) out.push(...members.map(rowElement));
    });
    return out;
  }
  function groupHeader(g, members) {
    const open = !collapsed.has(g.label);
    const tr = PS.el("tr", { class: "group-row", "data-group": g.label, "data-count": String(members.length) });
    const toggle = PS.el("button", { type: "button", class: "toggle", "aria-expanded": String(open),
      title: open ? "collapse this group" : "expand this group" }, open ? "▾" : "▸");
    toggle.addEventListener("click", () => { open ? collapsed.add(g.label) : collapsed.delete(g.label); draw(); });
    const label = PS.el("td", { colspan: "5", class: "group-label" });
    label.append(PS.el("span", { class: "group-key" }, grouping.key + " = "),
      PS.el("strong", { title: shownValue(g.value) }, shownValue(g.value)),
      PS.el("span", { class: "group-count" }, ` · ${members.length} run${members.length === 1 ? "" : "s"}`));
    if (members.length > 1) {
      label.appendChild(PS.el("a", { class: "group-compare", href: "/compare?runs=" + members.map((r) => r.id).join(","),
        title: "compare these runs on the compare page" }, "compare"));
    }
    const first = PS.el("td");
    first.appendChild(toggle);
    const cells = [first, label, ...MEANS.map(([key, kind]) => meanCell(members, key, kind)), PS.el("td")];
    const tools = PS.el("td", { class: "group-tools" });
    if (members.length > 1 && g.value !== null && (STUDY_TAGS.has(grouping.key) || g.varying.length > 0)) {
      const on = openViews.has(g.label);
      const b = PS.el("button", { type: "button", class: "parcoords-toggle", "aria-pressed": String(on),
        title: "the settings that vary between these runs and their outcomes, as parallel coordinates" }, on ? "hide parallel coordinates" : "parallel coordinates");
      b.addEventListener("click", () => { on ? openViews.delete(g.label) : openViews.add(g.label); draw(); });
      tools.appendChild(b);
    }
    cells.push(tools, PS.el("td"));
    tr.append(...cells);
    return tr;
  }
  // The mean of the runs that have a value; the title says how many that is.
  function meanCell(members, key, kind) {
    const vals = members.map((r) => r.values[key]).filter((v) => v !== null && v !== undefined && Number.isFinite(v));
    const td = PS.el("td", { class: "num mean", "data-key": key });
    if (!vals.length) { td.textContent = "–"; return td; }
    const mean = vals.reduce((a, b) => a + b, 0) / vals.length;
    td.textContent = kind === "dur" ? PS.fmtS(mean) : fmt({ values: { [key]: mean } }, key, kind);
    td.title = `mean of ${vals.length} of ${members.length} runs` + (vals.length < members.length ? " (the others have no value)" : "");
    return td;
  }
  // The view's row is kept across redraws (the table is redrawn on every push of the runs
  // list), and plotted again only when what it shows changed.
  function viewRow(g, members) {
    let view = views.get(g.label);
    if (!view) {
      const tr = PS.el("tr", { class: "parcoords-row", "data-group": g.label });
      const td = PS.el("td", { colspan: "17" });
      const div = PS.el("div", { class: "parcoords" }), caption = PS.el("p", { class: "muted parcoords-note" });
      td.append(div, caption); tr.appendChild(td);
      view = { tr, div, caption, drawn: "" };
      views.set(g.label, view);
    }
    const key = JSON.stringify([g.varying, grouping.target, members.map((r) => [r.id, r.values, r.config])]);
    if (key !== view.drawn) {
      view.drawn = key;
      view.caption.textContent = `${members.length} runs, a line each, coloured by final accuracy` +
        (g.varying.length ? `; the settings that vary: ${g.varying.join(", ")}` : "; no setting varies between them") +
        (g.more_varying ? ` (and ${g.more_varying} more, not drawn)` : "") + "; drag along an axis to pick a range";
      PSParcoords.draw(view.div, members, g, grouping.target).catch((e) => { view.caption.textContent = String(e); });
    }
    return view.tr;
  }
  function fmt(row, key, kind) {
    const v = row.values[key];
    if (v === null || v === undefined) return "–";
    if (kind === "pct") return PS.pct(v);
    if (kind === "secs") return v.toFixed(1);  // as psctl compare prints time to target
    if (kind === "rate") return Math.round(v).toLocaleString("en-US");
    return v.toFixed(2);
  }
  function rowElement(r) {
    const tr = PS.el("tr", { "data-id": r.id });
    const box = PS.el("input", { type: "checkbox", "aria-label": "select " + r.name });
    box.checked = chosen.has(r.id);
    box.addEventListener("change", () => { box.checked ? chosen.add(r.id) : chosen.delete(r.id); button.disabled = chosen.size === 0; });
    const name = PS.el("td", { class: "name" });
    name.appendChild(PS.el("a", { href: "/runs/" + r.id, title: r.name }, r.name));
    if (r.backend === "sim") name.appendChild(PS.el("span", { class: "sim", title: "virtual time" }, "sim"));
    if (r.values.oversubscribed) {
      name.appendChild(PS.el("span", { class: "warn", title: "more busy processes than cores: its timings include CPU contention" }, "oversubscribed"));
    }
    if (r.group) name.appendChild(PS.el("a", { class: "group", href: "/compare?group=" + encodeURIComponent(r.group), title: `compare the runs of group ${r.group} (mean ± std)` }, "group " + r.group));
    const num = (text, key) => PS.el("td", { class: "num", "data-key": key }, text);
    const cells = [PS.el("td"), PS.el("td", { class: "status " + r.status }, r.status), name, PS.el("td", {}, r.sync),
      PS.el("td", {}, `${r.workers} × ${r.servers}`), PS.el("td", { class: "dataset", title: r.dataset }, r.dataset),
      num(fmt(r, "final_accuracy", "pct"), "final_accuracy"), num(fmt(r, "best_accuracy", "pct"), "best_accuracy"),
      num(fmt(r, "time_to_target_s", "secs"), "time_to_target_s"), num(fmt(r, "startup_s", "secs"), "startup_s"),
      num(fmt(r, "samples_per_s", "rate"), "samples_per_s"),
      num(fmt(r, "idle_fraction", "pct"), "idle_fraction"), num(fmt(r, "staleness_mean", "num"), "staleness_mean"),
      num(PS.fmtS(r.values.wall_s), "wall_s"),
      // Month, day and time: the year and seconds only in the title, to keep the column narrow.
      PS.el("td", { class: "date", title: PS.date(r.started_at) }, PS.date(r.started_at).slice(5, 16)),
      tagsCell(r), notesCell(r)];
    cells[0].appendChild(box);
    tr.append(...cells);
    return tr;
  }

  // -- editing (tags and notes) -----------------------------------------------------------
  async function write(row, what, payload, cell) {
    const r = await fetch(`/api/runs/${row.id}/${what}`, {
      method: "PUT", body: JSON.stringify(payload),
      headers: { "Content-Type": "application/json", "X-Psctl-Write": "1" },
    });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) {
      const msg = cell.querySelector(".edit-error") || cell.appendChild(PS.el("span", { class: "edit-error", role: "alert" }));
      msg.textContent = data.detail || r.statusText;
      return false;
    }
    row.tags = data.tags; row.notes = data.notes; row.group = data.tags.group || null;
    return true;
  }
  function startEditing() { editing += 1; }
  function stopEditing() { editing = Math.max(0, editing - 1); if (editing === 0) draw(); }
  function tagsCell(row) {
    const td = PS.el("td", { class: "tags" });
    Object.entries(row.tags).forEach(([k, v]) => {
      const chip = PS.el("span", { class: "tag", title: `${k}=${v}` });
      chip.appendChild(PS.el("span", { class: "tag-text" }, `${k}=${v}`));
      const x = PS.el("button", { type: "button", class: "remove", title: `remove tag ${k}`, "aria-label": `remove tag ${k}` }, "×");
      x.addEventListener("click", async () => { if (await write(row, "tags", { remove: [k] }, td)) draw(); });
      chip.appendChild(x); td.appendChild(chip);
    });
    const add = PS.el("button", { type: "button", class: "add", title: "add a tag KEY=VALUE" }, "+ tag");
    add.addEventListener("click", () => {
      startEditing();
      const input = PS.el("input", { class: "tag-input", placeholder: "key=value", "aria-label": "new tag key=value", maxlength: "321" });
      let done = false;
      const finish = () => { if (!done) { done = true; stopEditing(); } };
      input.addEventListener("keydown", async (ev) => {
        if (ev.key === "Escape") { finish(); return; }
        if (ev.key !== "Enter") return;
        ev.preventDefault();
        const at = input.value.indexOf("=");
        const key = at > 0 ? input.value.slice(0, at).trim() : "";
        if (!key) { input.setCustomValidity("write key=value"); input.reportValidity(); return; }
        if (await write(row, "tags", { set: { [key]: input.value.slice(at + 1).trim() } }, td)) finish();
      });
      input.addEventListener("blur", () => setTimeout(() => { if (!td.querySelector(".edit-error")) finish(); }, 150));
      add.replaceWith(input); input.focus();
    });
    td.appendChild(add);
    return td;
  }
  function notesCell(row) {
    const td = PS.el("td", { class: "notes" });
    const text = PS.el("span", { class: "note-text", title: row.notes || "" }, row.notes || "");
    const edit = PS.el("button", { type: "button", class: "edit", title: "edit the notes of this run" }, row.notes ? "edit" : "+ note");
    edit.addEventListener("click", () => {
      startEditing();
      const area = PS.el("textarea", { rows: "3", "aria-label": "notes of " + row.name, maxlength: "10000" });
      area.value = row.notes || "";
      const save = PS.el("button", { type: "button" }, "Save"), cancel = PS.el("button", { type: "button" }, "Cancel");
      const finish = () => stopEditing();
      save.addEventListener("click", async () => { if (await write(row, "notes", { notes: area.value.trim() || null }, td)) finish(); });
      cancel.addEventListener("click", finish);
      area.addEventListener("keydown", (ev) => {
        if (ev.key === "Escape") finish();
        if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) save.click();
      });
      td.replaceChildren(area, save, cancel); area.focus();
    });
    td.append(text, edit);
    return td;
  }

  // -- controls ---------------------------------------------------------------------------
  function remember() {
    const q = new URLSearchParams();
    if (sort.key !== "started_at" || sort.dir !== -1) { q.set("sort", sort.key); q.set("dir", sort.dir > 0 ? "asc" : "desc"); }
    if (whereIn.value.trim()) q.set("where", whereIn.value.trim());
    if (targetIn.value && targetIn.value !== "97") q.set("target", targetIn.value);
    if (groupSel.value) q.set("group_by", groupSel.value);
    history.replaceState(null, "", q.toString() ? "?" + q : location.pathname);
  }
  document.querySelectorAll("#runs-table th[data-sort]").forEach((th) => {
    th.tabIndex = 0;
    const pick = () => {
      const key = th.dataset.sort;
      // The first click on a metric puts its best first (highest accuracy, shortest time).
      const better = th.classList.contains("num") && !/time_to|startup|idle|stale|wall/.test(key) ? -1 : 1;
      sort = sort.key === key ? { key, dir: -sort.dir } : { key, dir: key === "started_at" ? -1 : better };
      remember(); draw();
    };
    th.addEventListener("click", pick);
    th.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(); } });
  });
  $("table-filters").addEventListener("submit", (ev) => { ev.preventDefault(); remember(); refetch(); });
  whereIn.addEventListener("change", () => { remember(); refetch(); });
  targetIn.addEventListener("change", () => { remember(); refetch(); });
  groupSel.addEventListener("change", () => { wantedGroup = ""; remember(); refetch(); });
  statusSel.addEventListener("change", draw);
  syncSel.addEventListener("change", draw);
  button.addEventListener("click", () => { location.href = "/compare?runs=" + [...chosen].join(","); });
  refetch();
  connect();
})();
