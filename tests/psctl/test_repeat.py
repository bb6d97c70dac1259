"""``psctl launch --repeat 3``: three runs with seeds s..s+2, tagged as one group, which
``psctl compare`` shows as mean ± standard deviation (issue 13, acceptance 5)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import psctl
from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def group_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("repeat") / "experiments.db"
    done = psctl("launch", "--dataset", "digits", "--workers", "1", "--servers", "1",
                 "--epochs", "2", "--seed", "5", "--repeat", "3", "--name", "trio",
                 "--eval-interval", "0.5", "--no-live", db=db)
    assert done.returncode == 0, done.stderr
    assert "group trio: 3 runs; best test accuracy" in " ".join(done.stderr.split())
    return db


def test_repeat_creates_three_tagged_runs_with_consecutive_seeds(group_db: Path) -> None:
    rows = query(group_db, "SELECT r.name, json_extract(r.config_json, '$.train.seed'), t.value "
                           "FROM runs r JOIN tags t ON t.run_id = r.id AND t.key = 'group' "
                           "ORDER BY r.started_at")
    assert rows == [("trio-seed5", 5, "trio"), ("trio-seed6", 6, "trio"),
                    ("trio-seed7", 7, "trio")]


def test_compare_shows_the_group_as_mean_and_std(group_db: Path) -> None:
    best = [v for (v,) in query(group_db, "SELECT max(accuracy) FROM evaluations "
                                          "GROUP BY run_id")]
    # seconds of training: from each run's first iteration, start-up left out
    reached = [t for (t,) in query(
        group_db, "SELECT min(e.at) - (SELECT min(started_at) FROM iterations i "
                  "WHERE i.run_id = e.run_id) FROM evaluations e WHERE accuracy >= 0.5 "
                  "GROUP BY e.run_id")]
    done = psctl("compare", "--where", "group=trio", "--target", "0.5", "--json", db=group_db)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["runs"] == 3 and row["id"] == "trio"
    assert row["best_accuracy"] == pytest.approx(statistics.fmean(best))
    assert row["best_accuracy_std"] == pytest.approx(statistics.stdev(best))
    assert len(reached) == 3, "every run should reach 50 % on digits"
    assert row["time_to_target_s"] == pytest.approx(statistics.fmean(reached))
    assert row["time_to_target_s_std"] == pytest.approx(statistics.stdev(reached))
    table = psctl("compare", "--where", "group=trio", "--target", "0.5", db=group_db).stdout
    line = next(line for line in table.splitlines() if "trio (3 runs)" in line)
    assert line.count("±") >= 5
    assert f"{100 * statistics.fmean(best):.2f}% ± {100 * statistics.stdev(best):.2f}" in line
    per_run = json.loads(psctl("compare", "--per-run", "--json", db=group_db).stdout)
    assert sorted(r["name"] for r in per_run) == ["trio-seed5", "trio-seed6", "trio-seed7"]
