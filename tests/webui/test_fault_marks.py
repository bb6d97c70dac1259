"""Fault tolerance on the run page, in headless Chromium: a dashed line on the accuracy, loss and
throughput charts and on the synchronisation timeline at each injected fault, lost and rejoined
worker, resume and checkpoint, and banners that say the run was resumed and which faults it had.

The runs are written with the recorder (as the coordinator records them), with events at known
times, so each test knows how many marks each chart must draw and where. The page runs in UTC,
so the banner's times are known too. Every request off this machine is aborted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, EventRecord, IterationRecord, RunStatus
from tests.webui.chromium import block_foreign, needs_chromium, screenshot

pytestmark = [pytest.mark.integration, needs_chromium, pytest.mark.timeout(180)]

FAULTY, PLAIN, LIVE = "fa" * 16, "9" * 32, "1e" * 16
WORKERS, ITERATIONS = 2, 100  # one iteration a second: the timeline's last 20 s start at 79 s
TOP_CHARTS = ("acc", "tloss", "thr", "loss")
# (seconds after the start, kind, detail), in the order the coordinator records them.
EVENTS: list[tuple[float, str, dict[str, Any]]] = [
    (0.5, "training_started", {"total_iterations": 200}),
    (1.0, "fault_injected", {"spec": "drop:1%", "role": "worker", "rank": None, "pid": None}),
    (10.0, "checkpoint", {"seq": 1, "folder": "c/1", "bytes": 1000, "seconds": 0.1, "clocks": {}}),
    (20.0, "membership", {"workers": 4, "joining": [2, 3], "leaving": []}),
    (25.0, "server_lost", {"rank": 0, "pid": 4141}),
    (25.05, "failover_complete", {"index": 0, "rank": 1, "seconds": 0.04}),
    (26.0, "server_rejoined", {"rank": 0, "pid": 4144, "ranges": [0]}),
    (26.3, "rereplicated", {"index": 0, "rank": 0, "tail": 1, "chain": [1, 0], "bytes": 100,
                            "restore_s": 0.01, "held_s": 0.05, "seconds": 0.06}),
    (26.4, "primary_moved", {"index": 0, "rank": 0, "previous": 1, "chain": [0, 1],
                             "drain_s": 0.0, "seconds": 0.02}),
    (30.0, "checkpoint", {"seq": 2, "folder": "c/2", "bytes": 1000, "seconds": 0.1, "clocks": {}}),
    (40.0, "fault_injected", {"spec": "kill:worker:1@40s", "role": "worker", "rank": 1,
                              "pid": 4242}),
    (40.2, "worker_lost", {"rank": 1, "pid": 4242, "restart": 1, "max_restarts": 3}),
    (45.0, "worker_rejoined", {"rank": 1, "pid": 4343, "restarts": 1}),
    (50.0, "checkpoint", {"seq": 3, "folder": "c/3", "bytes": 1000, "seconds": 0.1, "clocks": {}}),
    (60.0, "server_membership", {"servers": 3, "joining": [1], "leaving": []}),
    (70.0, "checkpoint", {"seq": 4, "folder": "c/4", "bytes": 1000, "seconds": 0.1, "clocks": {}}),
    (75.0, "checkpoint_incomplete", {"seq": 5, "reason": "server 0 did not answer"}),
    (82.0, "resumed", {"checkpoint": 4, "folder": "c/4"}),
    (84.0, "training_resumed", {"total_iterations": 200, "checkpoint": 4,
                                "first_iterations": {"0": 70, "1": 70}}),
    (90.0, "checkpoint", {"seq": 5, "folder": "c/5", "bytes": 1000, "seconds": 0.1, "clocks": {}}),
    (95.0, "resumed", {"checkpoint": 5, "folder": "c/5"}),
    (96.0, "fault_skipped", {"spec": "kill:worker:0@96s", "reason": "the process has left"}),
]
MARKED = [e for e in EVENTS if e[1] not in ("training_started", "fault_skipped")]
LABELS = ["drop 1%", "4 workers", "server 0 lost", "shard 0 failed over (0.04 s)",
          "server 0 back", "shard 0 copied to server 0", "shard 0 served by server 0",
          "kill worker 1", "worker 1 lost", "worker 1 rejoined", "3 servers",
          "checkpoint 5 incomplete", "resumed from checkpoint 4", "resumed from checkpoint 5"]
TIMELINE_FROM_S = 79.0  # the first iteration of the timeline's window starts here


def _record(db: Path, run_id: str, start: float, events: list[tuple[float, str, dict[str, Any]]],
            *, finish: bool = True) -> Recorder:
    """A run of WORKERS workers, one iteration a second each, evaluated every 10 s."""
    recorder = Recorder(db)
    recorder.start_run(run_id, f"run-{run_id[:4]}", RunConfig().to_json_dict(), sync="asp",
                       workers=WORKERS, servers=1, dataset="digits", started_at=start)
    recorder.record_iterations([
        IterationRecord(worker=w, iteration=i, epoch=i // 50, started_at=start + i,
                        ended_at=start + i + 0.9, compute_s=0.6, push_s=0.05, pull_s=0.05,
                        wait_s=0.2, staleness=i % 3, loss=2.0 / (1 + i), samples=32,
                        bytes_sent=8000, bytes_received=8000)
        for w in range(WORKERS) for i in range(ITERATIONS)])
    for k in range(1, 11):
        recorder.record_evaluation(EvaluationRecord(
            at=start + 10 * k, elapsed_s=10.0 * k, step=20 * k, accuracy=0.5 + 0.04 * k,
            loss=1.0 / k, epoch=k // 5))
    for offset, kind, detail in events:
        recorder.record_event(EventRecord(at=start + offset, kind=kind, detail=detail))
    if finish:
        recorder.finish(RunStatus.FINISHED)
        recorder.close()
    else:
        recorder.flush()
    return recorder


START = float(int(time.time()) - 600)  # whole seconds: the banner's HH:MM:SS are exact


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fault-marks") / "experiments.db"
    _record(path, FAULTY, START, EVENTS)
    _record(path, PLAIN, START, [(0.5, "training_started", {"total_iterations": 200})])
    return path


@contextmanager
def _page(browser: Any, url: str, width: int = 1400) -> Iterator[Any]:
    """The run page at ``url`` in UTC, once every chart is drawn; no script error on exit."""
    page = browser.new_page(viewport={"width": width, "height": 1000}, timezone_id="UTC")
    page.route("**/*", block_foreign)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(url)
        page.wait_for_selector("body[data-complete='1']", timeout=30_000)
        # The timeline follows the first paint in a message of its own.
        page.wait_for_function(
            "Number(document.querySelector('#chart-timeline').dataset.points) > 0",
            timeout=15_000)
        yield page
    finally:
        page.close()
    assert errors == [], errors


def _marks(page: Any, chart: str) -> int:
    return int(page.get_attribute(f"#chart-{chart}", "data-fault-marks") or -1)


def _shapes(page: Any, chart: str) -> list[dict[str, Any]]:
    """The chart's event lines (not the band that shades start-up nor the line that marks a
    resume's downtime)."""
    return list(page.evaluate(f"(document.querySelector('#chart-{chart}').layout.shapes || [])"
                              ".filter((s) => s.name !== 'band' && s.name !== 'down')"))


def _training_s(db: Path, offsets: list[float]) -> list[float]:
    """Where the charts put moments of FAULTY: seconds of training from its first iteration,
    its two resumes' downtime (0.1 s each, from the last iteration before each to the first
    after) left out (engine/db/clock.py)."""
    from engine.db import open_engine
    from engine.db.clock import training_clock
    from engine.db.queries import reading

    engine = open_engine(db, readonly=True)
    try:
        with reading(engine, "the clock") as conn:
            clock = training_clock(conn, FAULTY)
    finally:
        engine.dispose()
    assert clock.downtime.total_s == pytest.approx(0.2)
    return [clock.seconds(START + offset) for offset in offsets]


def _labels(page: Any, chart: str) -> list[dict[str, Any]]:
    """The fault labels of a chart: its annotations but a "+N more labels" note."""
    return list(page.evaluate(f"(document.querySelector('#chart-{chart}').layout.annotations "
                              "|| []).filter(a => a.name !== 'more')"))


def _boxes(page: Any, chart: str) -> list[dict[str, Any]]:
    """Where each annotation of a chart is drawn, in page pixels."""
    return list(page.evaluate(
        f"[...document.querySelectorAll('#chart-{chart} .annotation')].map(a => {{"
        "const r = a.getBoundingClientRect(); "
        "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, "
        "text: a.textContent}; })"))


def _overlaps(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"]]


def _wait_marks(page: Any, chart: str, n: int) -> None:
    page.wait_for_function(
        f"document.querySelector('#chart-{chart}').dataset.faultMarks === '{n}'", timeout=10_000)


def _hms(offset: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(START + offset))


def test_fault_events_are_marked_on_the_time_charts(browser: Any, base: str, db: Path) -> None:
    with _page(browser, f"{base}/runs/{FAULTY}") as page:
        for chart in TOP_CHARTS:
            assert _marks(page, chart) == len(MARKED), chart
            shapes = _shapes(page, chart)
            assert len(shapes) == len(MARKED)
            # Where each happened, in seconds of training (the x-axis's default).
            assert [s["x0"] for s in shapes] == pytest.approx(
                _training_s(db, [e[0] for e in MARKED]))
            assert all(s["line"]["dash"] == "dash" for s in shapes)
            labels = _labels(page, chart)
            assert [a["text"] for a in labels] == LABELS
            # Each label at its line, in its line's colour.
            labelled = [s for s in shapes if s["line"]["width"] > 1]
            assert [a["x"] for a in labels] == pytest.approx([s["x0"] for s in labelled])
            assert [a["font"]["color"] for a in labels] == [s["line"]["color"] for s in labelled]
            # Checkpoints (and the restart of training) are thin, grey and unlabelled.
            light = [s for s in shapes if s["line"]["width"] < 1]
            assert len(light) == 6
            colours = {a["text"]: a["font"]["color"] for a in labels}
            assert colours["kill worker 1"] == "#d62728"  # red
            assert colours["worker 1 lost"] == "#ff7f0e"  # orange
            assert colours["worker 1 rejoined"] == "#2ca02c"  # green
            assert colours["resumed from checkpoint 4"] == "#1f77b4"  # blue
        assert _overlaps(_boxes(page, "acc")) == []
        # The labels are on the chart, as SVG text.
        text = page.locator("#chart-acc").text_content() or ""
        assert "kill worker 1" in text and "worker 1 rejoined" in text
        assert "checkpoint 3" not in text
        # The timeline shows the last 20 s: only the events inside that window are marked.
        in_window = [e for e in MARKED if e[0] >= TIMELINE_FROM_S]
        assert _marks(page, "timeline") == len(in_window) == 4
        timeline = [s for s in _shapes(page, "timeline") if s["line"]["dash"] == "dash"]
        assert [s["x0"] for s in timeline] == pytest.approx(
            _training_s(db, [e[0] for e in in_window]))
        assert int(page.get_attribute("#chart-timeline", "data-barriers") or -1) == 0
        screenshot(page, "run-page-faults.png")
        # Wall time: the same marks, at dates.
        page.select_option("#x-axis", "wall")
        page.wait_for_function(
            "document.querySelector('#chart-acc').layout.xaxis.title.text === 'wall time'",
            timeout=10_000)
        for chart in (*TOP_CHARTS, "timeline"):
            assert _marks(page, chart) == (4 if chart == "timeline" else len(MARKED))
            at = page.evaluate(f"document.querySelector('#chart-{chart}').layout.shapes"
                               ".filter(s => s.line.dash === 'dash').map(s => +s.x0 / 1000)")
            expected = [e[0] for e in MARKED if chart != "timeline" or e[0] >= TIMELINE_FROM_S]
            assert at == pytest.approx([START + offset for offset in expected])
        # Events have no iteration: on the iteration axis the top charts mark none, while the
        # timeline (always against time) keeps its marks.
        page.select_option("#x-axis", "iteration")
        _wait_marks(page, "acc", 0)
        for chart in TOP_CHARTS:
            assert _marks(page, chart) == 0 and _shapes(page, chart) == []
        assert _marks(page, "timeline") == 4


@pytest.mark.parametrize("width", [1400, 900])
def test_fault_labels_close_together_never_overlap(browser: Any, base: str, width: int) -> None:
    """Five labels within 1.4 s of a 100 s run (a server lost, its shard failed over, the server
    back, a copy handed to it and the shard moved): each is drawn, and no two overlap, on every
    time chart and at a narrow window too."""
    with _page(browser, f"{base}/runs/{FAULTY}", width) as page:
        for chart in TOP_CHARTS:
            boxes = _boxes(page, chart)
            shown = [b["text"] for b in boxes if not b["text"].startswith("+")]
            assert len(shown) + int(page.get_attribute(f"#chart-{chart}", "data-labels-left-out")
                                    or 0) == len(LABELS), chart
            assert len(shown) >= 10, (chart, shown)
            assert _overlaps(boxes) == [], chart
            crowded = {"server 0 lost", "shard 0 failed over (0.04 s)", "server 0 back",
                       "shard 0 copied to server 0", "shard 0 served by server 0"}
            assert crowded <= set(shown), (chart, shown)
        screenshot(page, f"run-page-fault-labels-{width}.png", full_page=False)


def test_resumed_and_faults_banners(browser: Any, base: str) -> None:
    with _page(browser, f"{base}/runs/{FAULTY}") as page:
        resumed = page.locator("#resumed")
        assert resumed.is_visible()
        assert resumed.inner_text() == (f"Resumed from checkpoint 4 at {_hms(82)}; "
                                        f"Resumed from checkpoint 5 at {_hms(95)}; down 0.2 s "
                                        "(to the first iteration after each), left out of "
                                        "training time")
        faults = page.locator("#faults")
        assert faults.is_visible()
        # Each spec once, in the order they took effect; a skipped fault is not listed.
        assert faults.inner_text().startswith("Faults injected: drop:1%, kill:worker:1@40s. ")
        assert not page.locator("#oversubscribed").is_visible()
        assert not page.locator("#simulated").is_visible()


def test_run_without_faults_has_no_marks_nor_banners(browser: Any, base: str) -> None:
    with _page(browser, f"{base}/runs/{PLAIN}") as page:
        assert not page.locator("#resumed").is_visible()
        assert not page.locator("#faults").is_visible()
        for chart in (*TOP_CHARTS, "timeline"):
            assert _marks(page, chart) == 0, chart
        assert _shapes(page, "acc") == []
        assert "fault tolerance" not in (page.locator("#chart-timeline .gtitle").text_content()
                                         or "")


def test_a_live_run_marks_a_fault_as_it_is_recorded(browser: Any, base: str, db: Path) -> None:
    start = time.time() - ITERATIONS - 5
    recorder = _record(db, LIVE, start, [(5.0, "checkpoint", {"seq": 1})], finish=False)
    try:
        with _page(browser, f"{base}/runs/{LIVE}") as page:
            assert _marks(page, "acc") == 1
            assert not page.locator("#faults").is_visible()
            now = time.time()
            recorder.record_event(EventRecord(at=now, kind="fault_injected", detail={
                "spec": "kill:worker:0@100s", "role": "worker", "rank": 0, "pid": 1}))
            recorder.record_event(EventRecord(at=now + 0.1, kind="worker_lost", detail={
                "rank": 0, "pid": 1, "restart": 1, "max_restarts": 3}))
            recorder.flush()
            _wait_marks(page, "acc", 3)
            page.wait_for_selector("#faults", state="visible", timeout=10_000)
            assert "kill:worker:0@100s" in page.locator("#faults").inner_text()
            assert [a["text"] for a in _labels(page, "thr")] == ["kill worker 0", "worker 0 lost"]
    finally:
        recorder.finish(RunStatus.FINISHED)
        recorder.close()
