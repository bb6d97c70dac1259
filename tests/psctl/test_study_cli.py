"""``psctl study`` end to end on the local backend: two tiny digits runs, one after another,
tagged; then report.md, its PNGs and summary.json, whose numbers are the database's. And
Ctrl-C during a study: the run stops, nothing is left running, the report says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import psctl
from tests.integration.support import processes_with, query, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TINY = """
[study]
name = "tiny"
title = "BSP against ASP on digits"
target = 0.5

[base]
cluster.backend = "local"
cluster.workers = 2
cluster.servers = 1
data.dataset = "digits"
data.train_limit = 600
train.epochs = {epochs}
eval.interval_s = 0.3

[[axis]]
name = "sync"
  [[axis.values]]
  label = "BSP"
  set = {{ "sync.model" = "bsp" }}
  [[axis.values]]
  label = "ASP"
  set = {{ "sync.model" = "asp" }}
"""
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(database, study file, stderr) of one finished study."""
    folder = tmp_path_factory.mktemp("study")
    study = folder / "tiny.toml"
    study.write_text(TINY.format(epochs=2))
    db = folder / "experiments.db"
    done = psctl("study", str(study), db=db)
    assert done.returncode == 0, done.stderr
    return db, study, done.stderr


def test_runs_every_point_in_order_with_progress_and_tags(ran: tuple[Path, Path, str]) -> None:
    db, _, stderr = ran
    assert "study tiny: point 1 of 2: sync=BSP" in stderr
    assert "study tiny: point 2 of 2: sync=ASP" in stderr
    runs = query(db, "SELECT id, name, json_extract(config_json, '$.sync.model') FROM runs "
                     "ORDER BY started_at")
    assert [(name, model) for _, name, model in runs] == [("tiny-bsp", "bsp"),
                                                          ("tiny-asp", "asp")]
    tags = {(run_id, key): value for run_id, key, value in query(db, "SELECT * FROM tags")}
    (study_id,) = {tags[(run_id, "study_id")] for run_id, _, _ in runs}
    assert len(study_id) == 8
    for (run_id, _, _), label in zip(runs, ["BSP", "ASP"], strict=True):
        assert tags[(run_id, "study")] == "tiny" and tags[(run_id, "sync")] == label
    assert f"study tiny ({study_id}): 2 runs" in stderr


def test_the_report_holds_the_table_and_the_plots(ran: tuple[Path, Path, str]) -> None:
    db, study, stderr = ran
    out = study.parent / "results" / "tiny"
    assert f"report: {out / 'report.md'}" in stderr
    report = (out / "report.md").read_text()
    assert report.startswith("# BSP against ASP on digits\n")
    assert "- command: `psctl study " in report and "- backend: local" in report
    for run_id, model in query(db, "SELECT id, json_extract(config_json, '$.sync.model') "
                                   "FROM runs"):
        (row,) = [line for line in report.splitlines() if f"`{run_id[:8]}`" in line]
        assert row.startswith(f"| {model.upper()} | finished |")
    for png in ("accuracy-time.png", "accuracy-step.png", "idle.png", "staleness.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, png
        assert f"]({png})" in report


def test_summary_numbers_are_the_databases(ran: tuple[Path, Path, str]) -> None:
    db, study, _ = ran
    summary = json.loads((study.parent / "results" / "tiny" / "summary.json").read_text())
    assert summary["complete"] and summary["planned_runs"] == 2 and summary["axes"] == ["sync"]
    assert [row["labels"] for row in summary["rows"]] == [{"sync": "BSP"}, {"sync": "ASP"}]
    for row in summary["rows"]:
        run_id = row["run_id"]
        best, count = query(db, "SELECT max(accuracy), count(*) FROM evaluations "
                                "WHERE run_id = ?", run_id)[0]
        (final,) = query(db, "SELECT accuracy FROM evaluations WHERE run_id = ? "
                             "ORDER BY at DESC, id DESC LIMIT 1", run_id)[0]
        (reached,) = query(db, "SELECT min(at) - (SELECT min(started_at) FROM iterations "
                               "WHERE run_id = ?1) FROM evaluations WHERE run_id = ?1 "
                               "AND accuracy >= 0.5", run_id)[0]
        iterations, idle, stale = query(
            db, "SELECT count(*), sum(wait_s) / sum(ended_at - started_at), avg(staleness) "
                "FROM iterations WHERE run_id = ?", run_id)[0]
        assert count >= 1 and reached is not None, "digits reaches 50 % in two epochs"
        assert row["best_accuracy"] == pytest.approx(best)
        assert row["final_accuracy"] == pytest.approx(final)
        assert row["time_to_target_s"] == pytest.approx(reached)
        assert row["iterations"] == iterations
        assert row["idle_fraction"] == pytest.approx(idle)
        assert row["staleness_mean"] == pytest.approx(stale)
        assert row["status"] == "finished" and row["epochs"] == pytest.approx(2.0, abs=0.5)
        # one epoch's iterations (half of the run's), whoever ran them, in seconds of training
        # (from the first iteration, as every time of a run is counted)
        (epoch_end,) = query(db, "SELECT ended_at - (SELECT min(started_at) FROM iterations "
                                 "WHERE run_id = ?1) FROM iterations WHERE run_id = ?1 "
                                 "ORDER BY ended_at LIMIT 1 OFFSET ?2", run_id,
                             iterations // 2 - 1)[0]
        assert row["epoch_time_s"] == pytest.approx(epoch_end)


def test_report_writes_the_report_again_from_the_database(ran: tuple[Path, Path, str],
                                                          tmp_path: Path) -> None:
    db, study, _ = ran
    first = json.loads((study.parent / "results" / "tiny" / "summary.json").read_text())
    done = psctl("study", str(study), "--report", first["study_id"], "--out", str(tmp_path),
                 db=db)
    assert done.returncode == 0, done.stderr
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["rows"] == first["rows"] and again["complete"]
    unknown = psctl("study", str(study), "--report", "00000000", "--out", str(tmp_path), db=db)
    assert unknown.returncode != 0 and "no run" in unknown.stderr


def test_ctrl_c_stops_the_study_and_still_reports(tmp_path: Path) -> None:
    study = tmp_path / "long.toml"
    study.write_text(TINY.format(epochs=500))
    db = tmp_path / "experiments.db"
    out = tmp_path / "report"
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    process = subprocess.Popen([sys.executable, "-m", "psctl", "study", str(study), "--out",
                                str(out)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: db.exists() and query(db, "SELECT count(*) FROM runs WHERE "
                                                   "iteration_count > 5")[0][0] == 1,
                 90, "the first run to be training")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "interrupted after 1 of 2 runs; no run is left running" in stderr
    ((run_id, status),) = query(db, "SELECT id, status FROM runs")
    assert status == "interrupted"
    assert processes_with(run_id) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and not summary["complete"]
    assert [row["status"] for row in summary["rows"]] == ["interrupted"]
    assert "**Interrupted**: 1 of 2 runs ran" in (out / "report.md").read_text()
