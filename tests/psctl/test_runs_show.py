"""``psctl runs show`` lists the evaluation its header quotes as best (issue 13, defect 3), and
says how many it shows when it does not list them all."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    ProcessSample,
    RunStatus,
)
from tests.conftest import psctl_in_process as psctl

T0 = 1_700_000_000.0


def _recorded_run(db: Path, accuracies: list[float],
                  events: Sequence[EventRecord] = (),
                  scales: Sequence[float | None] | None = None,
                  samples: Sequence[ProcessSample] = (), **fields: Any) -> str:
    """A finished run with one iteration and one evaluation per accuracy; ``fields`` set the
    same value in every iteration."""
    run = "e" * 32
    recorder = Recorder(db)
    try:
        recorder.start_run(run, "many-evals", RunConfig().to_json_dict(), sync="bsp", workers=1,
                           servers=1, dataset="mnist", started_at=T0)
        recorder.record_iterations([
            IterationRecord(**{
                "worker": 0, "iteration": i, "epoch": 0, "started_at": T0 + i,
                "ended_at": T0 + i + 1, "compute_s": 0.5, "push_s": 0.1, "pull_s": 0.1,
                "wait_s": 0.3, "staleness": 0, "loss": 1.0, "samples": 8, "bytes_sent": 10,
                "bytes_received": 10, "lr_scale": None if scales is None else scales[i],
                **fields})
            for i in range(len(accuracies))])
        for i, accuracy in enumerate(accuracies):
            recorder.record_evaluation(EvaluationRecord(
                at=T0 + i + 1, elapsed_s=i + 1, step=i, accuracy=accuracy, loss=1 - accuracy,
                epoch=i / 10))
        for event in events:
            recorder.record_event(event)
        recorder.record_process_samples(samples)
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    return run


def _best(db: Path) -> tuple[float, int]:
    with sqlite3.connect(db) as conn:
        accuracy, step = conn.execute(
            "SELECT accuracy, step FROM evaluations ORDER BY accuracy DESC, at LIMIT 1").fetchone()
    return float(accuracy), int(step)


@pytest.mark.parametrize("count", [7, 137])
def test_best_evaluation_is_listed(tmp_path: Path, count: int) -> None:
    db = tmp_path / "experiments.db"
    # A peak at an odd index that an every-other-row sample would skip, then a decline.
    accuracies = [0.5 + 0.3 * math.sin(i / 9) for i in range(count)]
    accuracies[min(count - 2, 37)] = 0.97
    _recorded_run(db, accuracies)
    best, step = _best(db)
    done = psctl("runs", "show", "@last", db=db)
    assert done.returncode == 0, done.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in done.stdout.splitlines() if line.startswith("│")]
    marked = [row for row in rows if row[-1] == "best"]
    assert len(marked) == 1, done.stdout
    assert marked[0][2:4] == [str(step), f"{100 * best:.2f}%"]
    assert f"best accuracy {100 * best:.2f}%" in done.stdout
    if count > 20:
        words = " ".join(done.stdout.split())
        assert f"20 of {count} shown, including the best and the last" in words
    else:
        assert "shown" not in done.stdout
    listed = json.loads(psctl("runs", "show", "@last", "--json", db=db).stdout)["evaluations"]
    assert len(listed) == count


def test_an_oversubscribed_run_says_so_in_runs_show_and_compare(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    message = "9 busy processes (6 workers, 2 servers, 1 evaluator) share 2 cores: timings " \
              "measure CPU contention as much as the consistency model"
    run = _recorded_run(db, [0.5, 0.6], [EventRecord(
        at=T0 + 1, kind="oversubscribed", detail={"cores": 2, "message": message})])
    shown = " ".join(psctl("runs", "show", run, db=db).stdout.split())
    assert f"oversubscribed: {message}" in shown
    (row,) = json.loads(psctl("compare", "--json", db=db).stdout)
    assert row["oversubscribed"] is True
    assert json.loads(psctl("runs", "show", run, "--json", db=db).stdout)["oversubscribed"] \
        == message


def test_notes_written_from_the_dashboard_show_in_runs_show(tmp_path: Path) -> None:
    from engine.recorder import set_notes

    db = tmp_path / "experiments.db"
    run = _recorded_run(db, [0.5, 0.6])
    assert "notes:" not in psctl("runs", "show", run, db=db).stdout
    set_notes(db, run, "diverged after the lr warm-up")
    assert "notes: diverged after the lr warm-up" in psctl("runs", "show", run, db=db).stdout
    assert json.loads(psctl("runs", "show", run, "--json", db=db).stdout)["notes"] \
        == "diverged after the lr warm-up"


def test_the_applied_lr_scale_shows_in_runs_show(tmp_path: Path) -> None:
    old = tmp_path / "before.db"
    plain = _recorded_run(old, [0.5, 0.6])
    assert "lr scale" not in psctl("runs", "show", plain, db=old).stdout  # nothing recorded
    db = tmp_path / "experiments.db"
    run = _recorded_run(db, [0.5, 0.6, 0.7, 0.8], scales=[0.25, 0.125, None, 0.0625])
    shown = psctl("runs", "show", run, db=db).stdout
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in shown.splitlines() if line.startswith("│")]
    (worker,) = [row for row in rows if row[0] == "0" and len(row) == 12]
    assert worker[-2:] == [f"{(0.25 + 0.125 + 0.0625) / 3:.4g}", "0.0625-0.25"]
    assert "lr scale: the factor the servers applied" in " ".join(shown.split())
    (stats,) = json.loads(psctl("runs", "show", run, "--json", db=db).stdout)["workers"]
    assert (stats["lr_scale_min"], stats["lr_scale_max"]) == (0.0625, 0.25)


def test_push_bytes_before_and_after_the_filter_show_in_runs_show_and_compare(
        tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    run = _recorded_run(db, [0.5, 0.6, 0.7, 0.8], push_bytes=2_000, push_bytes_dense=50_000)
    shown = psctl("runs", "show", run, db=db).stdout
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in shown.splitlines() if line.startswith("│")]
    (worker,) = [row for row in rows if row[0] == "0" and len(row) == 12]
    assert worker[-2:] == ["2.0", "25.0x"]  # KB per iteration, dense / sent
    (row,) = json.loads(psctl("compare", "--json", db=db).stdout)
    assert row["push_reduction"] == 25.0
    assert "push reduction" in " ".join(psctl("compare", "--all", db=db).stdout.split())


def test_memory_at_the_peak_shows_in_runs_show(tmp_path: Path) -> None:
    """Summed PSS beside summed RSS, right after the start-up line; a run recorded before PSS
    was read says nothing of it (and null in JSON)."""
    old = tmp_path / "before.db"
    plain = _recorded_run(old, [0.5, 0.6])
    assert "memory at the peak" not in psctl("runs", "show", plain, db=old).stdout
    assert json.loads(psctl("runs", "show", plain, "--json", db=old).stdout)["memory"] is None
    mib = 2**20
    processes = [("coordinator", 0, 300, 120), ("server", 0, 400, 60), ("worker", 0, 350, 22),
                 ("worker", 1, 350, 22), ("evaluator", 0, 320, 40)]
    samples = [ProcessSample(at=T0 + s, role=role, rank=rank, pid=10 + k, cpu_percent=5.0,
                             rss_bytes=rss * mib, pss_bytes=pss * mib if s == 1 else None)
               for s in range(3) for k, (role, rank, rss, pss) in enumerate(processes)]
    db = tmp_path / "experiments.db"
    run = _recorded_run(db, [0.5, 0.6], samples=samples)
    shown = psctl("runs", "show", run, db=db, env={"COLUMNS": "300"})  # the line unwrapped
    lines = [line.rstrip() for line in shown.stdout.splitlines()]
    (start,) = [k for k, line in enumerate(lines) if line.startswith("start-up")]
    assert lines[start + 1] == (
        "memory at the peak (at 0:00:01 of training): 264 MiB proportional (PSS) over 5 "
        "processes (RSS summed 1.68 GiB, counting shared pages in each); per worker 22.0 MiB, "
        "per server 60.0 MiB")
    memory = json.loads(psctl("runs", "show", run, "--json", db=db).stdout)["memory"]
    assert memory == {"peak_pss_bytes": 264 * mib, "at": 1.0, "processes": 5,
                      "rss_bytes": 1720 * mib,
                      "pss_by_role": {"coordinator": 120 * mib, "evaluator": 40 * mib,
                                      "server": 60 * mib, "worker": 22 * mib},
                      "unread": 0}


def test_one_time_base_start_up_one_number_and_downtime_said(tmp_path: Path) -> None:
    """Issue 57, item 8: the start-up line and the start-up paragraph give one number (from
    the command's start), the evaluations count seconds of training from the first iteration
    as the dashboard does, and a resumed run's downtime is said as such."""
    from tests.engine.db.test_clock import RUN, _launched_and_resumed

    db = tmp_path / "experiments.db"
    _launched_and_resumed(db)
    lines = [line.rstrip() for line in psctl("runs", "show", RUN, db=db,
                                             env={"COLUMNS": "300"}).stdout.splitlines()]
    text = "\n".join(lines)
    assert ("start-up 5.0 s (from the command's start to the first iteration), then 0:00:20 of "
            "training") in lines
    assert "first iteration -" not in text and "after the command started" not in text
    assert ("down 0:01:28 after 0:00:10 of training (to psctl resume and its first iteration): "
            "left out of every training time") in lines
    assert "     8.00 s  worker_lost: worker 0 lost (restart 1 of 3)" in text
    table = lines[lines.index("test evaluations") + 1:]
    first, second = [row for row in table if row.startswith("│")][:2]
    assert first.split("│")[1].strip() == "0:00:07" and second.split("│")[1].strip() == "0:00:15"
    shown = json.loads(psctl("runs", "show", RUN, "--json", db=db).stdout)
    assert [e["training_s"] for e in shown["evaluations"]] == [7.0, 15.0]
    assert shown["totals"]["startup_s"] == shown["start_up"]["first_iteration_s"] == 5.0
