"""The run page's second-hour features in headless Chromium: the lead that says how a run ended,
"no data" on empty charts, smoothing, the log scale and linked cursors (webui/static/
chart_tools.js), the live badge's truthfulness, the hidden tab that draws nothing and is caught
up when shown, and the simulated run's virtual time.

Runs are seeded row by row into a real SQLite file (the iterations by tests.webui.test_run_page's
seeder), so each test knows what the page must show. Every request off this machine is aborted.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from engine.db import open_engine
from engine.recorder import REBUILD_ROLLUPS_SQL
from tests.webui.chromium import checked_page, needs_chromium
from tests.webui.test_compare_api import record_resumed
from tests.webui.test_run_page import _seed

pytestmark = [pytest.mark.integration, needs_chromium, pytest.mark.timeout(180)]

FULL, LIVE, EMPTY, SIM = "a0" * 16, "b0" * 16, "c0" * 16, "d0" * 16
INTERRUPTED, CRASHED, DIVERGED, ENDING = "e0" * 16, "f0" * 16, "0a" * 16, "0b" * 16
RESUMED = "0c" * 16
SERIES = ("acc", "tloss", "thr", "loss", "stale_t", "idle", "bytes", "lr", "cpu", "mem")
DIVERGED_WHY = ("the model diverged: the test loss is nan at step 40 (accuracy 9.80%); try a "
                "lower learning rate or less staleness")


def _run(conn: sqlite3.Connection, run_id: str, *, status: str, reason: str | None = None,
         heartbeat: float = 9e9, config: dict[str, Any] | None = None) -> None:
    """A run without iterations: only its row (and what a test adds)."""
    start = time.time() - 120
    conn.execute(
        "INSERT INTO runs (id, name, status, reason, started_at, ended_at, heartbeat_at, "
        "config_json, sync, workers, servers, dataset, iteration_count) VALUES (?, ?, ?, ?, ?, "
        "?, ?, ?, 'asp', 2, 1, 'digits', 0)",
        (run_id, f"run-{run_id[:4]}", status, reason, start,
         None if status == "running" else start + 60, min(heartbeat, start + 60)
         if status != "running" else heartbeat, json.dumps(config or {})))


def _event(conn: sqlite3.Connection, run_id: str, kind: str, detail: dict[str, Any]) -> None:
    conn.execute("INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                 (run_id, time.time() - 100, kind, json.dumps(detail)))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run-page-tools") / "experiments.db"
    open_engine(path).dispose()
    with sqlite3.connect(path) as conn:
        _seed(conn, FULL, sync="asp")
        _seed(conn, LIVE, sync="asp", status="running", samples_s=30)
        _run(conn, EMPTY, status="finished")
        _run(conn, SIM, status="finished", config={"cluster": {"backend": "sim"}})
        _run(conn, INTERRUPTED, status="interrupted", reason="interrupted by the user")
        _run(conn, CRASHED, status="running", heartbeat=time.time() - 100)
        _run(conn, DIVERGED, status="failed", reason=DIVERGED_WHY)
        _event(conn, DIVERGED, "diverged", {"accuracy": 0.098, "step": 40})
        _run(conn, ENDING, status="running")
    conn.close()
    record_resumed(path, RESUMED, start=time.time() - 600)
    return path


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-complete='1']", timeout=30_000)


def _lead(page: Any) -> str:
    return " ".join(page.locator("#run-status").inner_text().split())


# -- how the run ended ----------------------------------------------------------------------------


@pytest.mark.parametrize(("run_id", "said"), [
    (INTERRUPTED, "Interrupted: Interrupted by the user. all logs"),
    (DIVERGED, "Diverged: The model diverged: the test loss is nan at step 40 (accuracy 9.80%); "
               "try a lower learning rate or less staleness. all logs"),
])
def test_the_lead_says_how_the_run_ended(browser: Any, base: str, run_id: str,
                                         said: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{run_id}")
        assert _lead(page) == said
        assert page.locator("#run-status a[href='#logs']").count() == 1


def test_a_crashed_run_says_its_processes_stopped(browser: Any, base: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{CRASHED}")
        assert _lead(page).startswith("Crashed: Its processes stopped without recording an end "
                                      "(no heartbeat since ")
        assert page.inner_text("#live-badge") == "crashed"


def test_a_run_that_fails_while_watched_gets_its_reason(browser: Any, base: str,
                                                       db: Path) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{ENDING}")
        assert not page.locator("#run-status").is_visible()
        assert page.inner_text("#live-badge") == "live"
        with sqlite3.connect(db) as conn:
            _event(conn, ENDING, "process_error", {
                "role": "server", "rank": 0, "message": "OSError: disk full",
                "traceback": "Traceback (most recent call last):\nOSError: disk full"})
            conn.execute("UPDATE runs SET status = 'failed', reason = ?, ended_at = ?, "
                         "heartbeat_at = ? WHERE id = ?",
                         ("server 0 failed: OSError: disk full", time.time(), time.time(),
                          ENDING))
        conn.close()
        page.wait_for_selector("#run-status", state="visible", timeout=15_000)
        page.wait_for_function("document.querySelector('#run-status .reason')?.textContent"
                               " === 'Server 0 failed: OSError: disk full.'", timeout=15_000)
        assert page.locator("#run-status a[data-role='server-0']").inner_text() == \
            "server 0's log"
        assert page.inner_text("#live-badge") == "failed"


# -- charts ---------------------------------------------------------------------------------------


def test_charts_without_data_say_so(browser: Any, base: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{EMPTY}")
        for chart in ("acc", "tloss", "thr", "loss", "stale_t", "idle", "bytes", "timeline",
                      "cpu", "mem"):
            div = page.locator(f"#chart-{chart}")
            assert div.get_attribute("data-empty") == "1", chart
            assert "no data" in (div.locator(".annotation").all_text_contents() or [""])[0]
            # No made-up axes: no tick labels at all, but the axis titles stay.
            assert div.locator(".xtick text, .ytick text").count() == 0, chart
        assert "accuracy (%)" in (page.locator("#chart-acc .ytitle").text_content() or "")


def test_a_finished_run_and_the_chart_tools(browser: Any, base: str) -> None:
    """A finished run with data: no lead, charts with ticks and no note; and the functions of
    window.psctlChartTools, which the compare page uses too."""
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{FULL}")
        assert not page.locator("#run-status").is_visible()
        assert page.get_attribute("#chart-acc", "data-empty") == "0"
        assert page.locator("#chart-acc .ytick text").count() > 2
        got = page.evaluate("""() => {
          const T = window.psctlChartTools;
          return {
            plain: T.smooth([1, 2, 3], 0),
            ema: T.smooth([1, null, 3], 0.5),
            mean: T.meanPerX([1, 1, 2, 2, 3], [0, 2, 4, 6, 9]),
            env: T.smoothTraces([{type: 'scatter', mode: 'lines', x: [1, 1, 2, 2],
                                  y: [0, 2, 4, 6], meta: {envelope: true}, name: 'w'}], 0.5)
                   .map(t => [t.x, t.y, t.showlegend]),
            log: T.logScale({yaxis: {title: {text: 'loss'}, rangemode: 'tozero'}}, true).yaxis,
            date: T.xNumber('2024-05-01 12:00:03.25')
                  - new Date(2024, 4, 1, 12, 0, 3, 250).getTime(),
            bad: (() => {
              try { T.smooth([1], 1); return 'no error'; } catch (e) { return e.name; } })(),
          }; }""")
        assert got["plain"] == [1, 2, 3]
        # Debiased: the first value is itself; the gap stays a gap; then (0.5*1 + 0.5*3) / 0.75.
        assert got["ema"][0] == 1 and got["ema"][1] is None
        assert got["ema"][2] == pytest.approx((0.25 + 1.5) / 0.75)
        assert got["mean"] == [[1, 2, 3], [1, 5, 9]]
        raw, smoothed = got["env"]
        assert raw == [[1, 1, 2, 2], [0, 2, 4, 6], False]
        assert smoothed[0] == [1, 2] and smoothed[1] == pytest.approx([1, (0.25 + 2.5) / 0.75])
        assert got["log"] == {"title": {"text": "loss (log)"}, "type": "log"}
        assert got["date"] == 0
        assert got["bad"] == "RangeError"


def test_smoothing_and_log_scale_apply_to_every_time_series(browser: Any, base: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{FULL}")
        traces = page.evaluate("document.querySelector('#chart-thr').data.length")
        page.evaluate("""() => { const s = document.getElementById('run-smoothing');
          s.value = '0.8'; s.dispatchEvent(new Event('input'));
          s.dispatchEvent(new Event('change')); }""")
        page.wait_for_function(
            f"document.querySelector('#chart-thr').data.length === {2 * traces}", timeout=10_000)
        assert page.inner_text(".chart-tools output") == "0.80"
        for chart in SERIES:
            data = page.evaluate(f"document.querySelector('#chart-{chart}').data"
                                 ".map(t => [t.meta || {}, t.showlegend])")
            assert data and any(m.get("smoothed") == 0.8 for m, _ in data), chart
            assert all(shown is False for m, shown in data if m.get("raw")), chart
        # The counts say how many points the chart has, not how many lines draw them.
        assert int(page.get_attribute("#chart-thr", "data-points") or 0) > 0
        page.check("#run-log")
        page.wait_for_function("document.querySelector('#chart-thr').layout.yaxis.type === 'log'",
                               timeout=10_000)
        for chart in SERIES:
            assert page.evaluate(f"document.querySelector('#chart-{chart}').layout.yaxis.type") \
                == "log", chart
        # Not the bar charts: a histogram and a breakdown.
        assert page.evaluate("document.querySelector('#chart-stale_h').layout.yaxis.type") != "log"
        # Remembered for the next page.
        page.reload()
        page.wait_for_selector("body[data-complete='1']", timeout=30_000)
        assert page.evaluate("document.querySelector('#chart-loss').layout.yaxis.type") == "log"
        assert page.input_value("#run-smoothing") == "0.8"
        page.evaluate("localStorage.clear()")


def test_hovering_one_time_series_shows_the_same_x_on_the_others(browser: Any,
                                                                 base: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{FULL}")
        # Where the middle point of the all-workers throughput line is, on the screen.
        x, y, value = page.evaluate("""() => {
          const gd = document.querySelector('#chart-thr'), t = gd.data[0];
          const i = Math.floor(t.x.length / 2), box = gd.getBoundingClientRect();
          const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
          return [box.left + xa._offset + xa.l2p(t.x[i]),
                  box.top + ya._offset + ya.l2p(t.y[i]), t.x[i]]; }""")
        page.mouse.move(x, y)
        page.wait_for_function(
            "document.querySelector('#chart-loss').dataset.linkedX !== undefined", timeout=10_000)
        linked = float(page.get_attribute("#chart-loss", "data-linked-x") or "nan")
        # The point Plotly picked under the mouse (the nearest of any trace's: a worker's line
        # may pass closer than the middle point aimed at) is the x every chart was given.
        assert linked == float(page.get_attribute("#chart-thr", "data-linked-x") or "nan")
        xs = page.evaluate("document.querySelector('#chart-thr').data.flatMap((t) => t.x || [])")
        assert any(x == pytest.approx(linked) for x in xs if x is not None)
        assert abs(linked - value) < 10.0  # near where the mouse was
        # The other time series show hover labels of their own at that x.
        for chart in ("loss", "idle", "bytes"):
            assert page.locator(f"#chart-{chart} .hoverlayer .hovertext").count() > 0, chart
        # Bar charts are not time series: left alone.
        assert page.locator("#chart-breakdown .hoverlayer .hovertext").count() == 0


# -- live: the badge, a hidden tab ----------------------------------------------------------------


def test_the_badge_says_reconnecting_only_while_no_socket_is_open(browser: Any,
                                                                 base: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{LIVE}")
        assert page.inner_text("#live-badge") == "live"
        page.evaluate("window.__old = window.__psctl.socket; window.__psctl.socket.close()")
        page.wait_for_function("window.__psctl.sockets === 2 && "
                               "document.getElementById('live-badge').textContent === 'live'",
                               timeout=15_000)
        badges = [b for _, b in page.evaluate("window.__psctl.badges")]
        assert badges[-2:] == ["reconnecting", "live"]
        # A late close of the old socket cannot say "reconnecting" while the new one is open.
        page.evaluate("window.__old.onclose()")
        page.wait_for_timeout(200)
        assert page.inner_text("#live-badge") == "live"
        assert [b for _, b in page.evaluate("window.__psctl.badges")] == badges


def test_a_hidden_tab_draws_nothing_and_catches_up_when_shown(browser: Any, base: str,
                                                              db: Path) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{LIVE}")
        page.evaluate("""() => { window.__state = 'hidden';
          Object.defineProperty(document, 'visibilityState',
                                {configurable: true, get: () => window.__state});
          document.dispatchEvent(new Event('visibilitychange')); }""")
        assert page.inner_text("#live-badge") == "paused"
        page.wait_for_timeout(800)  # the pause reaches the server before the new rows
        before = page.evaluate("[window.__psctl.messages, window.__psctl.renders.length, "
                               "window.__psctl.latestT]")
        with sqlite3.connect(db) as conn:
            newest = conn.execute("SELECT max(ended_at) FROM iterations WHERE run_id = ?",
                                  (LIVE,)).fetchone()[0]
            conn.execute("INSERT INTO iterations (run_id, worker, iteration, epoch, started_at, "
                         "ended_at, compute_s, push_s, pull_s, wait_s, staleness, loss, samples,"
                         " bytes_sent, bytes_received) VALUES (?, 0, 10000, 0, ?, ?, .3, .05, "
                         ".05, .1, 0, 0.5, 16, 1000, 1000)", (LIVE, newest, newest + 0.5))
            conn.execute("UPDATE runs SET iteration_count = iteration_count + 1 WHERE id = ?",
                         (LIVE,))
            origin, = conn.execute("SELECT started_at FROM runs WHERE id = ?", (LIVE,)).fetchone()
            second = int(newest + 0.5 - origin)
            conn.execute(REBUILD_ROLLUPS_SQL, {"run": LIVE, "origin": origin, "lo": second,
                                               "hi": second})
        conn.close()
        page.wait_for_timeout(2500)  # five polls of a live run: none is sent to a hidden tab
        after = page.evaluate("[window.__psctl.messages, window.__psctl.renders.length]")
        assert after == before[:2]
        page.evaluate("window.__state = 'visible'; "
                      "document.dispatchEvent(new Event('visibilitychange'))")
        page.wait_for_function(f"window.__psctl.latestT >= {newest + 0.5}", timeout=10_000)
        assert page.inner_text("#live-badge") == "live"


def test_a_simulated_run_says_its_time_is_virtual(browser: Any, base: str) -> None:
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{SIM}")
        assert page.locator("#simulated").inner_text().startswith(
            "Simulated cluster, virtual time: every time on this page is the simulation's clock")
        assert page.inner_text("#run-summary").startswith("simulated · ")
        assert page.evaluate("document.querySelector('#chart-thr').layout.xaxis.title.text") \
            == "virtual training time (s, from the first iteration)"


def test_a_resumed_run_is_one_time_axis_from_its_first_iteration_with_a_gap(
        browser: Any, base: str) -> None:
    """5 s of start-up, 30 s of training, down from 30 s to 98 s (the first iteration after the
    resume started at start + 103), 30 s more: x counts seconds of training from the first
    iteration (one time base: the compare page's), the lines break where it was down, a line
    labelled with the downtime marks it, and a band the start-up."""
    with checked_page(browser) as page:
        _open(page, f"{base}/runs/{RESUMED}")
        # What its model logged (psctl.log) on the same clock, not shifted by the start-up:
        # iteration i logged at the end of the iteration, i + 1 s into training (before the kill).
        page.wait_for_function("document.body.dataset.userMetrics === '1'", timeout=30_000)
        logged = page.evaluate("""() => document.querySelector(
            '#user-metrics [data-metric="grad_norm"]').data[0].x""")
        assert logged[:3] == pytest.approx([1.0, 2.0, 3.0]) and max(logged) <= 60.0 + 1e-6
        got = page.evaluate("""() => {
            const d = document.querySelector('#chart-thr');
            const t = d.data.find((t) => Array.isArray(t.y) && t.y.includes(null));
            const i = t ? t.y.indexOf(null) : -1;
            return { xs: d.data.flatMap((t) => t.x || []).filter((x) => x !== null),
                     around: t ? [t.x[i - 1], t.x[i + 1]] : null,
                     bands: (d.layout.shapes || []).filter((s) => s.label && s.label.text)
                       .map((s) => [s.label.text, s.x0, s.x1]),
                     title: d.layout.xaxis.title.text };
        }""")
    assert got["title"].endswith("training time (s, from the first iteration)")
    assert got["around"] is not None  # a line broken where it was down
    before, after = got["around"]
    assert before <= 30.0 <= after <= 32.0
    assert min(got["xs"]) >= 0.0 and max(got["xs"]) <= 60.0 + 1e-6
    assert ["down 0:01:08", 30.0, 30.0] in [[n, round(a, 6), round(b, 6)]
                                            for n, a, b in got["bands"]]
    assert ["start-up", -5.0, 0.0] in [[n, round(a, 6), round(b, 6)] for n, a, b in got["bands"]]
