// How a run ended, in words, and its role logs. A failed (or diverged), interrupted or crashed
// run's page leads with its status and reason under the title, linked to the log of the role
// that failed; the Logs panel lists the run's role logs (/api/runs/RUN/logs) and shows the
// chosen one's tail (/api/runs/RUN/logs/ROLE) in a <pre>. run.js calls update() after each
// render with what it knows; logs are fetched only when the page opens, when the run ends and
// when a role is picked, so a live page costs nothing more for them.
"use strict";
window.psctlRunStatus = (() => {
  const RUN = window.PSCTL_RUN;
  const lead = document.getElementById("run-status");
  const roles = document.getElementById("log-roles");
  const text = document.getElementById("log-text");
  const note = document.getElementById("log-note");
  const TAIL_BYTES = 64 * 1024;
  const HEADINGS = { failed: "Failed", interrupted: "Interrupted", crashed: "Crashed" };
  let shownKey = null, listedFor = null, reason = null, reasonAsked = false, current = null;

  const words = (role) => role.replace("-", " ");  // worker-0 -> worker 0
  const size = (n) => n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
  // A reason as a sentence: a capital first, a full stop last.
  function sentence(s) {
    const t = String(s || "").trim();
    if (!t) return t;
    const first = t[0].toUpperCase() + t.slice(1);
    return /[.!?]$/.test(first) ? first : first + ".";
  }
  // The role whose failure ended the run: the one of the first process error (or divergence)
  // recorded, else the first role the reason names; null when neither says.
  function failedRole(why, events) {
    const ev = events.find((e) => e.kind === "process_error" && e.detail && e.detail.role)
      || events.find((e) => e.kind === "diverged" && e.detail && e.detail.role);
    if (ev) {
      const d = ev.detail;
      return d.role === "worker" || d.role === "server" ? `${d.role}-${d.rank}` : d.role;
    }
    const m = /\b(worker|server) (\d+)\b/.exec(why || "") || /\b(coordinator|evaluator)\b/.exec(why || "");
    if (!m) return null;
    return m[2] !== undefined ? `${m[1]}-${m[2]}` : m[1];
  }
  const logLink = (role, label) => {
    const a = PS.el("a", { href: `#log=${role}`, "data-role": role }, label);
    a.addEventListener("click", () => show(role, true));  // the same hash twice fires no event
    return a;
  };

  // -- the lead: status and reason ---------------------------------------------------------------
  function renderLead(summary, events, simulated) {
    const status = summary.status;
    const diverged = events.find((e) => e.kind === "diverged");
    const heading = status === "failed" && diverged ? "Diverged" : HEADINGS[status];
    if (!heading) { lead.hidden = true; lead.dataset.status = status; return; }
    if (!reasonAsked && reason === null && status !== "crashed") {
      // The run ended while the page was open: the snapshot had no reason yet.
      reasonAsked = true;
      fetch(`/api/runs/${RUN}`).then((r) => r.ok ? r.json() : null).then((d) => {
        if (d && d.reason) { reason = d.reason; shownKey = null; renderLead(summary, events, simulated); }
      }).catch(() => { /* the lead says what it has */ });
    }
    const crashError = events.find((e) => e.kind === "process_error");
    let why = reason;
    if (status === "crashed") {
      why = `its processes stopped without recording an end (no heartbeat since ${PS.date(summary.heartbeat_at)})`;
    } else if (!why) {
      why = diverged && diverged.detail && diverged.detail.message ? diverged.detail.message
        : crashError ? `${words(`${crashError.detail.role}-${crashError.detail.rank}`)} failed: ${crashError.detail.message}`
          : "no reason was recorded";
    }
    const role = simulated ? (status === "failed" ? "sim" : null) : failedRole(why, events);
    const trace = crashError && crashError.detail && crashError.detail.traceback;
    const key = JSON.stringify([heading, why, role, Boolean(trace)]);
    lead.hidden = false;
    lead.dataset.status = status;
    if (key === shownKey) return;
    shownKey = key;
    const line = PS.el("p", { class: "lead-reason" });
    line.append(PS.el("strong", {}, heading), ": ", PS.el("span", { class: "reason" }, sentence(why)), " ");
    const links = PS.el("span", { class: "lead-links" });
    if (role) links.append(logLink(role, role === "sim" ? "the simulation's log" : `${words(role)}'s log`), " · ");
    links.append(PS.el("a", { href: "#logs" }, "all logs"));
    line.append(links);
    const parts = [line];
    if (trace) {
      const details = PS.el("details", { class: "traceback" });
      details.append(PS.el("summary", {}, "traceback"), PS.el("pre", {}, trace));
      parts.push(details);
    }
    lead.replaceChildren(...parts);
  }

  // -- the logs panel ----------------------------------------------------------------------------
  async function loadList() {
    try {
      const reply = await fetch(`/api/runs/${RUN}/logs`);
      const body = await reply.json();
      if (!reply.ok) { note.textContent = body.detail || `HTTP ${reply.status}`; roles.replaceChildren(); return; }
      note.textContent = body.note ? sentence(body.note) : body.logs.length ? "Pick a role to see the end of its log."
        : `No role of this run has written a log yet (${body.roles.join(", ")}).`;
      roles.replaceChildren(...body.logs.map((e) => {
        const b = PS.el("button", { type: "button", "data-role": e.role, "aria-pressed": String(e.role === current),
          title: `${e.role}.log, ${size(e.size)}, written ${PS.date(e.mtime)}` }, `${words(e.role)} (${size(e.size)})`);
        b.addEventListener("click", () => { history.replaceState(null, "", `#log=${e.role}`); show(e.role, false); });
        return b;
      }));
    } catch (err) {
      note.textContent = `The logs could not be listed: ${err}`;
    }
  }

  let show = async (role, scroll) => {
    current = role;
    roles.querySelectorAll("button").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.role === role)));
    if (scroll) document.getElementById("logs").scrollIntoView({ block: "start" });
    text.hidden = false;
    text.dataset.role = role;
    text.textContent = "loading…";
    try {
      const reply = await fetch(`/api/runs/${RUN}/logs/${encodeURIComponent(role)}?bytes=${TAIL_BYTES}`);
      if (current !== role) return;  // another role was picked meanwhile
      if (!reply.ok) {
        const body = await reply.json().catch(() => ({}));
        text.textContent = "";
        note.textContent = body.detail || `HTTP ${reply.status}`;
        return;
      }
      const total = Number(reply.headers.get("X-Log-Size")), from = Number(reply.headers.get("X-Log-Offset"));
      text.textContent = await reply.text() || "(empty)";
      note.textContent = from > 0 ? `${words(role)}: the last ${size(total - from)} of ${size(total)}`
        : `${words(role)}: the whole log (${size(total)})`;
      text.scrollTop = text.scrollHeight;  // the end is where a traceback is
      text.dataset.loaded = "1";
    } catch (err) {
      if (current === role) note.textContent = `The log could not be read: ${err}`;
    }
  };

  function fromHash() {
    const m = /^#log=([a-z]+(?:-\d+)?)$/.exec(location.hash);
    if (m) show(m[1], true);
  }
  window.addEventListener("hashchange", fromHash);

  // The list is fetched once the panel is in view (or a log is asked for), and again when the
  // run ends (a last look at the sizes): a page nobody scrolls down asks for nothing.
  let wanted = false, status = null;
  function listNow() {
    const key = status === "running" ? "running" : "ended";
    if (!wanted || listedFor === key) return;
    const again = listedFor !== null;
    listedFor = key;
    loadList().then(() => { if (again && current) asked(current, false); });  // its last lines
  }
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) { wanted = true; listNow(); }
  }).observe(document.getElementById("logs"));
  const asked = show;
  show = (role, scroll) => { wanted = true; listNow(); return asked(role, scroll); };

  // What run.js knows after each render: the summary, the events, the reason and the config.
  function update(state) {
    if (state.reason !== undefined && state.reason !== null) reason = state.reason;
    renderLead(state.summary, state.events, Boolean(state.simulated));
    status = state.summary.status;
    listNow();
    if (!hashRead) { hashRead = true; fromHash(); }
  }
  let hashRead = false;
  return { update, show: (role) => show(role, true), failedRole, sentence };
})();
