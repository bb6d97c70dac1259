"""A study's [tune] (issue 41, part 3): each point tries its settings on seeds of its own, is
run at its best, and the report gives every setting's score and the share that reached the
target; Optuna's search is seeded, so --report replays it to the same choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psctl.study_rows import Row
from psctl.study_tune import PENALTY, score
from tests.conftest import psctl, psctl_in_process
from tests.integration.support import query

STUDY = """
[study]
name = "tuned"
title = "Tuned"
target = 0.8

[base]
cluster.backend = "sim"
cluster.workers = 2
cluster.servers = 1
data.dataset = "digits"
model.hidden = [32]
stop.budget = "3s"
regime.compute_ms = 10.0
sim.server_ms = 1.0

[[axis]]
name = "sync"
key = "sync.model"
values = ["bsp", "asp"]

[tune]
seeds = 2
set = { "stop.budget" = "2s" }
"""
GRID = STUDY + """
  [[tune.param]]
  key = "optimizer.lr"
  values = [0.0005, 0.1]
"""
OPTUNA = STUDY.replace("[tune]", "[tune]\nmethod = \"optuna\"\ntrials = 3") + """
  [[tune.param]]
  key = "optimizer.lr"
  low = 0.001
  high = 0.5
  log = true
"""


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_each_point_runs_at_its_best_setting(tmp_path: Path) -> None:
    study, db = tmp_path / "tuned.toml", tmp_path / "x.db"
    study.write_text(GRID)
    done = psctl("study", str(study), "--jobs", "2", db=db)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "results" / "tuned" / "summary.json").read_text())
    tuning = summary["tuning"]
    for point in tuning["points"]:
        scores = {t["params"]["optimizer.lr"]: t["score"] for t in point["tried"]}
        assert scores[0.1] < scores[0.0005]  # 0.0005 cannot reach 80 % in 2 s of digits
        assert point["best"] == {"optimizer.lr": 0.1}
        assert point["reached_share"] == 0.5
    main = query(db, "SELECT r.name, r.config_json FROM runs r WHERE r.name NOT LIKE '%-tune%'")
    assert sorted(n for n, _ in main) == ["tuned-asp", "tuned-bsp"]
    assert {json.loads(c)["optimizer"]["lr"] for _, c in main} == {0.1}
    tuning_runs = query(db, "SELECT r.name, t.value FROM runs r JOIN tags t ON t.run_id = r.id "
                            "AND t.key = 'tune'")
    assert len(tuning_runs) == 8  # 2 points x 2 settings x 2 seeds
    every = query(db, "SELECT name, config_json FROM runs")
    seeds = {json.loads(c)["train"]["seed"] for n, c in every if "-tune" in n}
    main_seeds = {json.loads(c)["train"]["seed"] for _, c in main}
    assert seeds and not seeds & main_seeds  # no main run's seed chose its setting
    report = (tmp_path / "results" / "tuned" / "report.md").read_text()
    assert "## Tuning" in report and "| bsp | optimizer.lr=0.1 |" in report
    assert "1 of 2 (50%)" in report


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_an_optuna_search_is_replayed_by_report(tmp_path: Path) -> None:
    study, db = tmp_path / "tuned.toml", tmp_path / "x.db"
    study.write_text(OPTUNA)
    done = psctl("study", str(study), "--jobs", "2", db=db)
    assert done.returncode == 0, done.stderr
    first = json.loads((tmp_path / "results" / "tuned" / "summary.json").read_text())
    tried = [[t["params"] for t in p["tried"]] for p in first["tuning"]["points"]]
    assert all(len(t) == 3 for t in tried)
    assert all(0.001 <= s["optimizer.lr"] <= 0.5 for t in tried for s in t)
    again = psctl("study", str(study), "--report", first["study_id"], "--out",
                  str(tmp_path / "again"), db=db)
    assert again.returncode == 0, again.stderr
    second = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert second["tuning"]["points"] == first["tuning"]["points"]
    assert second["rows"] == first["rows"]
    assert second["wall"] is None  # a new folder: no measured wall time to keep
    same = psctl("study", str(study), "--report", first["study_id"], db=db)
    assert same.returncode == 0, same.stderr
    kept = json.loads((tmp_path / "results" / "tuned" / "summary.json").read_text())
    assert kept["wall"] == first["wall"]  # rewritten in place: the invocation's wall time kept


@pytest.mark.parametrize(("tune", "message"), [
    ('[tune]\n[[tune.param]]\nkey = "optimizer.lr"\nlow = 0.01\nhigh = 1.0',
     "ranges (low, high) are for method optuna"),
    ('[tune]\nmethod = "optuna"\n[[tune.param]]\nkey = "optimizer.lr"\nvalues = [0.1]',
     "method optuna needs trials"),
    ('[tune]\n[[tune.param]]\nkey = "sync.model"\nvalues = ["bsp"]',
     "axis sync sets it"),
    ('[tune]\n[[tune.param]]\nkey = "optimizer.lrr"\nvalues = [0.1]',
     "unknown setting 'optimizer.lrr'"),
    ('[tune]\n[[tune.param]]\nkey = "optimizer.lr"\nvalues = [-1.0]',
     "[tune] setting optimizer.lr=-1"),
    ('[tune]\nmethod = "optuna"\ntrials = 2\n[[tune.param]]\nkey = "optimizer.lr"\n'
     'low = 0.0\nhigh = 1.0\nlog = true', "a log range needs low > 0"),
])
def test_a_wrong_tune_table_fails_before_anything_runs(tmp_path: Path, tune: str,
                                                        message: str) -> None:
    study = tmp_path / "tuned.toml"
    study.write_text(STUDY.split("[tune]")[0] + tune + "\n")
    done = psctl_in_process("study", str(study), "--dry-run", db=tmp_path / "x.db")
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert not (tmp_path / "x.db").exists()


def test_the_dry_run_lists_the_tuning(tmp_path: Path) -> None:
    study = tmp_path / "tuned.toml"
    study.write_text(GRID)
    done = psctl_in_process("study", str(study), "--dry-run", db=tmp_path / "x.db")
    assert done.returncode == 0, done.stderr
    assert "tune (grid): 2 settings x 2 seeds per point (8 runs)" in done.stdout


def _row(reached: float | None, duration: float, final: float | None) -> Row:
    return Row(labels={}, seed=0, run_id="r", name="n", status="finished",
               time_to_target_s=reached, final_accuracy=final, best_accuracy=final,
               iterations=1, epochs=None, idle_fraction=None, staleness_mean=None,
               bytes_per_sample=None, duration_s=duration)


def test_a_seed_that_missed_the_target_counts_twice_its_duration() -> None:
    assert PENALTY == 2.0
    rows = [_row(3.0, 10.0, 0.9), _row(None, 10.0, 0.5)]
    assert score(rows, "time_to_target") == pytest.approx((3.0 + 20.0) / 2)
    assert score(rows, "final_accuracy") == pytest.approx(0.7)
    assert score([_row(None, 5.0, None)], "best_accuracy") == 0.0
    assert score([], "time_to_target") is None
