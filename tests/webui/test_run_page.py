"""The run page in headless Chromium on runs seeded row by row: system metrics (CPU and memory
per process, PSS beside RSS where it was read), the oversubscription banner, the ElasticBSP
card only where there are barriers, the timeline's worker order, the one duration format, and
the keys the servers stored (issue 44) where their ``server_stats`` said, live as they say it.

The database is written with plain SQL inserts of real rows (as bench/dashboard.py does), so
each test knows exactly what the page must show. Every request off this machine is aborted.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.db import open_engine
from engine.recorder import REBUILD_ROLLUPS_SQL
from tests.webui.chromium import block_foreign, chromium, needs_chromium, screenshot, serving
from tests.webui.hosts import TEST_HOSTS
from webui import live
from webui.app import create_app

WORKERS, SERVERS = 4, 2
DURATION_S = 3725.0  # 1:02:05
PROCESSES = [("coordinator", 0), ("evaluator", 0), *(("server", s) for s in range(SERVERS)),
             *(("worker", w) for w in range(WORKERS))]
LABELS = {"coordinator", "evaluator", "server 0", "server 1", "worker 0", "worker 1",
          "worker 2", "worker 3"}
BSP, ELASTIC, LIVE = "b" * 32, "e" * 32, "a" * 32
# What each server's server_stats says at its end: summed, 4,000 keys of 80,000 bytes, sparse.
SERVER_STATS = [{"rank": 0, "pushes": 9, "stored_keys": 3_000, "stored_bytes": 72_000,
                 "sparse": True},
                {"rank": 1, "pushes": 9, "stored_keys": 1_000, "stored_bytes": 8_000,
                 "sparse": False}]
STORED = {"keys": 4_000, "bytes": 80_000, "sparse": True}
STORED_LINE = ("keys the servers stored: 4,000 (sparse: only keys pushed are stored), 20 bytes a "
               "key: 78.1 KiB of values, optimizer state and key maps")


def _seed(conn: sqlite3.Connection, run_id: str, *, sync: str, status: str = "finished",
          oversubscribed: bool = False, syncs: int = 0, samples_s: float = DURATION_S,
          simulated: bool = False, pss: bool = False, stored: bool = False) -> None:
    t0 = time.time() - DURATION_S - 60
    ended = None if status == "running" else t0 + DURATION_S
    heartbeat = 9e9 if status == "running" else t0 + DURATION_S
    conn.execute(
        "INSERT INTO runs (id, name, status, started_at, ended_at, heartbeat_at, config_json, "
        "sync, workers, servers, dataset, iteration_count) VALUES (?, ?, ?, ?, ?, ?, '{}', ?, "
        "?, ?, 'digits', ?)",
        (run_id, f"{sync}-run", status, t0, ended, heartbeat, sync, WORKERS, SERVERS,
         WORKERS * 200))
    # The last 100 s hold the iterations; worker 3 starts first, then 2, 0, 1, so that rows
    # arrive in the order the old timeline drew its rows in (3, 2, 0, 1).
    offsets = {3: 0.0, 2: 0.1, 0: 0.2, 1: 0.3}
    rows = []
    for w, off in offsets.items():
        t = t0 + DURATION_S - 100 + off
        for i in range(200):
            d = 0.5
            rows.append((run_id, w, i, i // 50, t, t + d, .3, .05, .05, .1, i % 3,
                         2.0 / (1 + i), 16, 1000, 1000, t + .4, t + .45, 0.25 / (1 + i % 4),
                         900, 18_000, 0))
            t += d
    conn.executemany(f"INSERT INTO iterations VALUES ({','.join('?' * 21)})", rows)
    conn.execute(REBUILD_ROLLUPS_SQL, {"run": run_id, "origin": t0, "lo": 0, "hi": 10**9})
    # PSS as the sampler reads it in a larger run: each process in turn, here every 4 s.
    conn.executemany(
        "INSERT INTO process_samples (run_id, at, role, rank, pid, cpu_percent, rss_bytes, "
        "pss_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(run_id, t0 + s, role, rank, 1000 + n, 20.0 + 10 * n, (100 + n) * 2**20,
          (40 + n) * 2**20 if pss and s % 4 == n % 4 else None)
         for s in range(int(samples_s)) for n, (role, rank) in enumerate(PROCESSES)])
    conn.executemany("INSERT INTO evaluations (run_id, at, elapsed_s, step, epoch, accuracy, "
                     "loss) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [(run_id, t0 + 600 * k, 600 * k, 100 * k, k, 0.5 + 0.05 * k, 1.0 / (k + 1))
                      for k in range(1, 7)])
    if oversubscribed:
        detail = {"cores": 2, "message": "7 busy processes share 2 cores"}
        conn.execute("INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                     (run_id, t0 + 1, "oversubscribed", json.dumps(detail)))
    if simulated:
        detail = {"network": "10gbit:50us", "server_network": "10gbit:50us", "compute_ms": 100.0,
                  "compute_measured": False, "update_ms": 2.0, "update_measured": True}
        conn.execute("INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                     (run_id, t0, "simulated", json.dumps(detail)))
    for k in range(syncs):
        _add_sync(conn, run_id, k, t0 + DURATION_S - 90 + 10 * k)
    if stored:
        _add_server_stats(conn, run_id, t0 + DURATION_S)


def _add_server_stats(conn: sqlite3.Connection, run_id: str, at: float) -> None:
    conn.executemany("INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                     [(run_id, at, "server_stats", json.dumps(d)) for d in SERVER_STATS])


def _add_sync(conn: sqlite3.Connection, run_id: str, index: int, at: float) -> None:
    predicted = [[at + 1.0], [at + 1.1], [at + 1.2], [at + 1.3]] if index else []
    conn.execute("INSERT INTO syncs VALUES (?, ?, ?, 'mean', 4, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (run_id, index, at, "[1, 1, 1, 1]", json.dumps(predicted), "[1, 1, 1, 1]",
                  "[2, 2, 2, 2]", 0.02 * index, json.dumps([at + 1, at + 1.03, at + 1.01,
                                                             at + 1.02]), 0.03, at + 1.05))


@pytest.fixture(scope="module")
def run_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("run-page") / "experiments.db"
    open_engine(db).dispose()
    with sqlite3.connect(db) as conn:
        _seed(conn, BSP, sync="bsp", oversubscribed=True, pss=True, stored=True)
        _seed(conn, ELASTIC, sync="elastic", syncs=5, samples_s=120, simulated=True)
    return db


# -- the websocket snapshot (no browser) ----------------------------------------------------------


def test_process_samples_follow_the_snapshot_bounded(run_db: Path) -> None:
    engine = open_engine(run_db, readonly=True)
    try:
        _, state = live.snapshot(engine, BSP)
        message = live.processes_message(engine, state)
        samples = message["samples"]
        per_process: dict[tuple[str, int], int] = {}
        for role, rank, _at, _cpu, _rss, _pss in samples:
            per_process[(role, rank)] = per_process.get((role, rank), 0) + 1
        # 3725 samples per process are averaged into at most PROCESS_POINTS time slots.
        assert set(per_process) == set(PROCESSES)
        assert max(per_process.values()) <= live.PROCESS_POINTS + 1
        assert message["width_s"] > 1
        assert {s[4] for s in samples if s[0] == "coordinator"} == {100 * 2**20}
        # PSS, read every 4 s, is the slot's maximum: every slot of 7 s holds a reading.
        assert message["fields"][5] == "pss_bytes"
        assert {s[5] for s in samples if s[0] == "coordinator"} == {40 * 2**20}
        small = live.processes_message(engine, live.snapshot(engine, ELASTIC)[1])
        assert small["width_s"] == 0 and len(small["samples"]) == 120 * 8  # as recorded
        assert {s[5] for s in small["samples"]} == {None}  # a run from before PSS
        assert live.delta(engine, state) is None  # nothing new
    finally:
        engine.dispose()


@contextlib.contextmanager
def watched_copy(run_db: Path, tmp_path: Path) -> Iterator[tuple[Path, Any, live.LiveState]]:
    """A copy of the database to write to, and the live view of the elastic run on it."""
    db = tmp_path / "copy.db"
    shutil.copy(run_db, db)
    engine = open_engine(db, readonly=True)
    try:
        _, state = live.snapshot(engine, ELASTIC)
        yield db, engine, state
    finally:
        engine.dispose()


def test_new_samples_arrive_as_deltas(run_db: Path, tmp_path: Path) -> None:
    with watched_copy(run_db, tmp_path) as (db, engine, state):
        with sqlite3.connect(db) as conn:
            at = conn.execute("SELECT max(at) FROM process_samples WHERE run_id = ?",
                              (ELASTIC,)).fetchone()[0]
            conn.execute("INSERT INTO process_samples VALUES (?, ?, 'worker', 0, 1, 55.0, 3, 2)",
                         (ELASTIC, at + 1))
        change = live.delta(engine, state)
        assert change is not None and change["process_samples"] == [
            ["worker", 0, at + 1, 55.0, 3, 2]]
        assert live.delta(engine, state) is None  # sent once


def test_the_stored_keys_reach_the_page_where_the_servers_said(run_db: Path) -> None:
    """The run API and the page's snapshot carry the sums of engine.db.stored; a run whose
    servers said nothing of them (before issue 44) has null there."""
    client = TestClient(create_app(run_db, hosts=TEST_HOSTS))
    assert client.get(f"/api/runs/{BSP}").json()["stored"] == STORED
    assert client.get(f"/api/runs/{ELASTIC}").json()["stored"] is None
    engine = open_engine(run_db, readonly=True)
    try:
        assert live.snapshot(engine, BSP)[0]["stored"] == STORED
        assert live.snapshot(engine, ELASTIC)[0]["stored"] is None
    finally:
        engine.dispose()


def test_the_stored_keys_arrive_as_a_delta_when_the_servers_end(run_db: Path,
                                                                 tmp_path: Path) -> None:
    with watched_copy(run_db, tmp_path) as (db, engine, state):
        with sqlite3.connect(db) as conn:
            conn.execute("INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                         (ELASTIC, time.time(), "checkpoint", "{}"))
        change = live.delta(engine, state)
        assert change is not None and "stored" not in change  # no server has said yet
        with sqlite3.connect(db) as conn:
            _add_server_stats(conn, ELASTIC, time.time())
        change = live.delta(engine, state)
        assert change is not None and change["stored"] == STORED


def test_plotly_is_served_gzipped_and_immutable(run_db: Path) -> None:
    client = TestClient(create_app(run_db, hosts=TEST_HOSTS))
    page = client.get(f"/runs/{BSP}").text
    found = re.search(r'"/vendor/plotly\.min\.js(\?v=[^"]+)"', page)
    assert found is not None
    url = found.group(1)
    deadline = time.monotonic() + 30  # compressed in a thread started with the app
    while True:
        answer = client.get(f"/vendor/plotly.min.js{url}", headers={"Accept-Encoding": "gzip"})
        if answer.headers.get("content-encoding") == "gzip" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert answer.text.lstrip().startswith("/**") and "plotly.js" in answer.text[:200]
    plain = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.content == answer.content


# -- the page in headless Chromium ----------------------------------------------------------------



@pytest.fixture(scope="module")
def base(run_db: Path) -> Iterator[str]:
    with serving(run_db) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def _open(browser: Any, url: str, errors: list[str]) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.route("**/*", block_foreign)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_selector("body[data-complete='1']", timeout=30_000)
    # The timeline and the process samples follow the first paint in messages of their own.
    for chart in ("timeline", "cpu"):
        page.wait_for_function(
            f"Number(document.querySelector('#chart-{chart}').dataset.points) > 0",
            timeout=15_000)
    return page


def _svg_text(page: Any, selector: str) -> str:
    """Plotly's titles are SVG text, which has no inner_text."""
    return str(page.locator(selector).text_content() or "")


def _trace_names(page: Any, chart: str) -> list[str]:
    return list(page.evaluate(f"document.querySelector('#chart-{chart}').data.map(t => t.name)"))


@pytest.mark.integration
@needs_chromium
@pytest.mark.timeout(120)
def test_bsp_run_page(browser: Any, base: str) -> None:
    errors: list[str] = []
    page = _open(browser, f"{base}/runs/{BSP}", errors)
    # System metrics: one line per process, labelled by role and rank; memory as RSS and, dotted
    # in the same colour, PSS.
    assert sorted(_trace_names(page, "cpu")) == sorted(LABELS)
    assert sorted(_trace_names(page, "mem")) == sorted(f"{label} {kind}" for label in LABELS
                                                       for kind in ("RSS", "PSS"))
    assert _svg_text(page, "#chart-cpu .ytitle") == "CPU (% of one core)"
    assert "MB" in _svg_text(page, "#chart-mem .ytitle")
    assert "RSS solid, PSS (shared pages split) dotted" in _svg_text(page, "#chart-mem .gtitle")
    coordinator = page.evaluate(
        "document.querySelector('#chart-mem').data.filter(t => t.name.startsWith('coordinator'))"
        ".map(t => [t.name, t.line.dash || 'solid', t.line.color, Math.max(...t.y)])")
    (_, rss_dash, rss_color, rss_mb), (_, pss_dash, pss_color, pss_mb) = sorted(
        coordinator, key=lambda t: t[0].endswith("PSS"))
    assert (rss_dash, pss_dash, rss_color) == ("solid", "dot", pss_color)
    assert (rss_mb, pss_mb) == (pytest.approx(100 * 2**20 / 1e6), pytest.approx(40 * 2**20 / 1e6))
    # The oversubscription banner says how many processes shared how many cores.
    banner = page.locator("#oversubscribed")
    assert banner.is_visible()
    text = banner.inner_text()
    assert "7 busy processes (4 workers, 2 servers, 1 evaluator)" in text
    assert "2 CPU cores" in text and "contention" in text
    assert not page.locator("#simulated").is_visible()
    # The process samples shown download as CSV, one row per point.
    with page.expect_download() as download:
        page.click("#count-cpu a.proc-csv")
    lines = Path(download.value.path()).read_text().splitlines()
    shown = int(page.get_attribute("#chart-cpu", "data-points") or 0)
    assert lines[0] == "role,rank,at,cpu_percent,rss_bytes,pss_bytes" and len(lines) == shown + 1
    assert {line.split(",")[5] for line in lines[1:] if line.startswith("coordinator,")} \
        == {str(40 * 2**20)}
    # No barriers in a bsp run: no ElasticBSP card.
    assert not page.locator("#chart-elastic").is_visible()
    # Workers 0..3 from top to bottom, although worker 3's rows come first.
    ticks = page.evaluate(
        "[...document.querySelectorAll('#chart-timeline .yaxislayer-above .ytick text')]"
        ".map(t => [t.getBoundingClientRect().top, t.textContent])")
    assert [name for _, name in sorted(ticks)] == [f"worker {w}" for w in range(WORKERS)]
    assert page.locator("#run-duration").inner_text() == "duration 1:02:05"
    # The keys the servers stored, as `psctl runs show` says it.
    assert page.locator("#stored").inner_text() == STORED_LINE
    assert "updates since the pull" in _svg_text(page, "#chart-stale_t .ytitle")
    assert "updates since the pull" in _svg_text(page, "#chart-stale_h .xtitle")
    assert "seconds spent per phase" in _svg_text(page, "#chart-breakdown .xtitle")
    # The applied learning-rate scale (iterations.lr_scale), min and max per bucket and worker.
    assert page.locator("#chart-lr").is_visible()
    assert _svg_text(page, "#chart-lr .ytitle") == "factor on the learning rate"
    assert sorted(_trace_names(page, "lr")) == [f"worker {w}" for w in range(WORKERS)]
    ys = page.evaluate("document.querySelector('#chart-lr').data.flatMap(t => t.y)")
    assert min(ys) == pytest.approx(0.0625) and max(ys) == pytest.approx(0.25)
    # Push bytes as sent and before the push filter, beside the totals.
    assert _trace_names(page, "bytes") == ["sent", "received", "pushes sent",
                                           "pushes before filtering"]
    rates = page.evaluate("document.querySelector('#chart-bytes').data.map(t => Math.max("
                          "...t.y.filter(v => v !== null)))")
    assert rates[3] == pytest.approx(20 * rates[2])
    screenshot(page, "run-page.png")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    page.close()
    assert errors == []


@pytest.mark.integration
@needs_chromium
@pytest.mark.timeout(120)
def test_elastic_run_page(browser: Any, base: str) -> None:
    errors: list[str] = []
    page = _open(browser, f"{base}/runs/{ELASTIC}", errors)
    elastic = page.locator("#chart-elastic")
    assert elastic.is_visible()
    assert int(elastic.get_attribute("data-points") or 0) == 4  # sync 0 predicts nothing
    assert not page.locator("#oversubscribed").is_visible()
    assert not page.locator("#stored").is_visible()  # its servers said nothing of it
    # A simulated run says its times are virtual, and with which models.
    simulated = page.locator("#simulated")
    assert simulated.is_visible()
    assert simulated.inner_text() == (
        "Simulated cluster, virtual time: compute 100 ms per batch (given), network "
        "10gbit:50us, 2.00 ms per dense update of the whole model (measured).")
    assert len(_trace_names(page, "cpu")) == len(PROCESSES)
    # No PSS recorded (a run from before schema 8): RSS alone, as before.
    assert sorted(_trace_names(page, "mem")) == sorted(LABELS)
    assert "resident memory" in _svg_text(page, "#chart-mem .ytitle")
    page.close()
    assert errors == []


@pytest.mark.integration
@needs_chromium
@pytest.mark.timeout(120)
def test_live_run_shows_new_samples_and_barriers(browser: Any, base: str,
                                                 run_db: Path) -> None:
    with sqlite3.connect(run_db) as conn:
        _seed(conn, LIVE, sync="asp", status="running", samples_s=30)
    errors: list[str] = []
    page = _open(browser, f"{base}/runs/{LIVE}", errors)
    assert not page.locator("#chart-elastic").is_visible()
    assert not page.locator("#stored").is_visible()  # no server has ended yet
    points = int(page.get_attribute("#chart-cpu", "data-points") or 0)
    with sqlite3.connect(run_db) as conn:
        at = conn.execute("SELECT max(at) FROM process_samples WHERE run_id = ?",
                          (LIVE,)).fetchone()[0]
        conn.executemany("INSERT INTO process_samples VALUES (?, ?, ?, ?, 1, 50.0, 1048576, "
                         "NULL)",
                         [(LIVE, at + 1, role, rank) for role, rank in PROCESSES])
        _add_sync(conn, LIVE, 0, at)
        _add_sync(conn, LIVE, 1, at + 0.5)
        _add_server_stats(conn, LIVE, at + 1)
    # The barriers show the ElasticBSP card at once; the CPU chart, out of view at the bottom
    # of a live page, is not redrawn (that is what a live page saves) until it is scrolled to.
    page.wait_for_selector("#chart-elastic", state="visible", timeout=10_000)
    # The servers' server_stats: what they stored shows without a reload.
    page.wait_for_selector("#stored", state="visible", timeout=10_000)
    assert page.locator("#stored").inner_text() == STORED_LINE
    page.wait_for_function("window.__psctl.offScreen.includes('cpu')", timeout=10_000)
    assert page.evaluate("document.querySelector('#chart-cpu').getBoundingClientRect().top "
                         "> window.innerHeight + 200")
    assert int(page.get_attribute("#chart-cpu", "data-points") or 0) == points
    page.locator("#chart-cpu").scroll_into_view_if_needed()
    page.wait_for_function(
        f"Number(document.querySelector('#chart-cpu').dataset.points) === {points + 8}",
        timeout=10_000)
    page.close()
    assert errors == []



@pytest.mark.integration
@needs_chromium
@pytest.mark.timeout(120)
def test_charts_above_the_fold_show_before_plotly_runs(browser: Any, base: str) -> None:
    """Until plotly.js has run (here: never, its request is held back), the four charts above
    the fold are drawn as static SVG previews from the snapshot."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.route("**/*", block_foreign)
    page.route("**/vendor/plotly*", lambda route: route.abort())  # the later route goes first
    page.goto(f"{base}/runs/{BSP}")
    page.wait_for_selector("body[data-painted='1']", timeout=30_000)
    for chart, title in (("acc", "Test accuracy"), ("tloss", "Test loss"), ("thr", "Throughput"),
                         ("loss", "Training loss")):
        svg = page.locator(f"#chart-{chart} svg.preview")
        assert title in (svg.text_content() or "")
        assert svg.locator("polyline").count() >= 1
    assert page.evaluate("window.__psctl.preview") is True
    assert page.locator(".plot-container").count() == 0  # nothing drawn by plotly
    screenshot(page, "run-page-preview.png", full_page=False)
    page.close()
