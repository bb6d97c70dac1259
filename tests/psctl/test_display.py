"""The live view's progress line: start-up status, then a bar with the run's total and an ETA
(issue 13, feature 1); one duration format (defect 11); simulated runs marked and the target
in percent in the runs list and a run's detail (issue 42)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from engine.analysis.cells import fmt_seconds
from engine.db.queries import Progress, Startup
from psctl.display import Plan, fmt_target, progress_view
from tests.conftest import psctl_in_process as psctl
from tests.psctl.recorded import recorded_run

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
           "97 % test accuracy" in text


def test_durations_are_h_mm_ss_everywhere() -> None:
    assert [fmt_seconds(s) for s in (0, 59.6, 217, 3 * 3600 + 62)] == \
        ["0:00:00", "0:01:00", "0:03:37", "3:01:02"]
    assert fmt_seconds(None) == "-"


# -- the runs list and a run's detail: simulated runs and the target (issue 42) ---------------


def _sim_db(tmp_path: Path) -> Path:
    db = tmp_path / "experiments.db"
    recorded_run(db, "a" * 32, "real-run", stop={"target_accuracy": 0.975})
    recorded_run(db, "b" * 32, "sim-run", simulated=True, started_at=T0 + 100)
    return db


def _rows(text: str) -> dict[str, list[str]]:
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines()
            if line.startswith("│")]
    return {row[1]: row for row in rows}


def test_the_runs_list_marks_simulated_runs(tmp_path: Path) -> None:
    db = _sim_db(tmp_path)
    done = psctl("runs", "ls", db=db)
    rows = _rows(done.stdout)
    assert rows["sim-run"][2] == "finished (sim)" and rows["real-run"][2] == "finished"
    assert "(sim): simulated in virtual time" in done.stdout
    listed = {run["name"]: run["simulated"] for run in
              json.loads(psctl("runs", "ls", "--json", db=db).stdout)}
    assert listed == {"sim-run": True, "real-run": False}


def test_runs_show_says_a_simulated_run_is_in_virtual_time(tmp_path: Path) -> None:
    db = _sim_db(tmp_path)
    shown = psctl("runs", "show", "sim-run", db=db).stdout.splitlines()
    assert shown[0].endswith("  simulated") and shown[1].endswith("of virtual time")
    assert any(line.startswith("simulated in virtual time: compute 5 ms") for line in shown)
    real = psctl("runs", "show", "real-run", db=db).stdout
    assert "virtual" not in real and "simulated" not in real
    assert "stops at 97.5 % test accuracy" in real


def test_the_target_is_written_in_percent() -> None:
    assert [fmt_target(a) for a in (0.97, 0.5, 0.995, 1.0)] == ["97 %", "50 %", "99.5 %",
                                                                 "100 %"]
