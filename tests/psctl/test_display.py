"""The live view's progress line: start-up status, then a bar with the run's total and an ETA
(issue 13, feature 1); one duration format (defect 11)."""

from __future__ import annotations

from rich.console import Console

from engine.analysis.cells import fmt_seconds
from engine.db.queries import Progress, Startup
from psctl.display import Plan, progress_view

T0 = 1_700_000_000.0
PLAN = Plan(workers=2, servers=1, epochs=3)


def _progress(*, done: int, rate: float, elapsed: float, startup: Startup) -> Progress:
    return Progress(run_id="r" * 32, name="live", status="running", now=T0 + elapsed,
                    started_at=T0, ended_at=None, heartbeat_at=T0 + elapsed,
                    total_iterations=done, iterations_per_s=rate, workers=(),
                    latest_evaluation=None, best_accuracy=None, startup=startup)


def _text(progress: Progress, plan: Plan = PLAN) -> str:
    console = Console(width=160, no_color=True, record=True)
    console.print(progress_view(progress, plan))
    return " ".join(console.export_text().split())


def test_start_up_says_what_it_waits_for() -> None:
    text = _text(_progress(done=0, rate=0, elapsed=3, startup=Startup(2, 1, 0, None)))
    assert "start-up: 1 of 1 servers listening, 0 of 2 workers loaded their data " \
           "(2 of 4 processes joined)" in text


def test_bar_has_the_total_and_an_eta() -> None:
    text = _text(_progress(done=300, rate=20.0, elapsed=15, startup=Startup(4, 1, 2, 1200)))
    assert "25.0% 300 of 1,200 iterations · ETA 0:00:45" in text


def test_a_nearer_time_limit_sets_the_bar_and_the_eta() -> None:
    plan = Plan(workers=2, servers=1, epochs=3, max_seconds=60, target_accuracy=0.97)
    text = _text(_progress(done=300, rate=20.0, elapsed=45, startup=Startup(4, 1, 2, 1200)),
                 plan)
    assert "75.0% time limit 0:01:00 (300 of 1,200 iterations) · ETA 0:00:15 · or at " \
           "97.00% test accuracy" in text


def test_durations_are_h_mm_ss_everywhere() -> None:
    assert [fmt_seconds(s) for s in (0, 59.6, 217, 3 * 3600 + 62)] == \
        ["0:00:00", "0:01:00", "0:03:37", "3:01:02"]
    assert fmt_seconds(None) == "-"
