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
    done = psctl("compare", "--where", "group=trio", "--target", "0.6", "--json", db=group_db)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["runs"] == 3 and row["id"] == "trio"
    assert row["best_accuracy"] == pytest.approx(statistics.fmean(best))
    assert row["best_accuracy_std"] == pytest.approx(statistics.stdev(best))
    assert len(reached) == 3, "every run should reach 50 % on digits"
    assert row["time_to_target_s"] == pytest.approx(statistics.fmean(reached))
    assert row["time_to_target_s_std"] == pytest.approx(statistics.stdev(reached))
    table = psctl("compare", "--where", "group=trio", "--target", "0.6", db=group_db).stdout
    line = next(line for line in table.splitlines() if "trio (3 runs)" in line)
    assert line.count("±") >= 5
    assert f"{100 * statistics.fmean(best):.2f}% ± {100 * statistics.stdev(best):.2f}" in line
    per_run = json.loads(psctl("compare", "--per-run", "--json", db=group_db).stdout)
    assert sorted(r["name"] for r in per_run) == ["trio-seed5", "trio-seed6", "trio-seed7"]


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BSP and ASP, three seeds each, on the simulated cluster with a straggler."""
    db = tmp_path_factory.mktemp("pairs") / "experiments.db"
    for sync in ("bsp", "asp"):
        done = psctl("launch", "--backend", "sim", "--compute-ms", "20", "--dataset", "digits",
                     "--workers", "4", "--servers", "1", "--sync", sync, "--straggler",
                     "0:3x", "--epochs", "4", "--seed", "1", "--repeat", "3", "--name", sync,
                     "--eval-interval", "0.05", "--no-live", db=db)
        assert done.returncode == 0, done.stderr
    return db


def test_a_group_speedup_is_paired_by_seed_with_its_interval(two_groups: Path) -> None:
    import math

    from scipy import stats

    rows = json.loads(psctl("compare", "--target", "0.6", "--baseline", "bsp-seed1", "--json",
                            db=two_groups).stdout)
    by_name = {r["id"]: r for r in rows}
    reached = {(group, seed): t for group, seed, t in query(
        two_groups, "SELECT t.value, json_extract(r.config_json, '$.train.seed'), "
                    "(SELECT min(at) FROM evaluations e WHERE e.run_id = r.id "
                    "AND accuracy >= 0.6) - (SELECT min(started_at) FROM iterations i "
                    "WHERE i.run_id = r.id) FROM runs r JOIN tags t ON t.run_id = r.id "
                    "AND t.key = 'group'")}
    logs = [math.log(reached[("bsp", s)] / reached[("asp", s)]) for s in (1, 2, 3)]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(logs) / math.sqrt(3)
    asp = by_name["asp"]
    assert asp["speedup"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (asp["speedup_low"], asp["speedup_high"]) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)))
    expected = ("faster" if asp["speedup_low"] > 1 else "slower" if asp["speedup_high"] < 1
                else "no difference at 95 %")
    assert asp["verdict"] == expected and by_name["bsp"]["speedup"] == pytest.approx(1.0)
    # and each metric's mean carries its Student t interval over the seeds
    accuracy = [a for (a,) in query(two_groups, "SELECT max(e.accuracy) FROM evaluations e "
                                                "JOIN tags t ON t.run_id = e.run_id AND "
                                                "t.value = 'asp' GROUP BY e.run_id")]
    low, high = stats.t.interval(0.95, 2, loc=statistics.fmean(accuracy),
                                 scale=statistics.stdev(accuracy) / math.sqrt(3))
    assert (asp["best_accuracy_low"], asp["best_accuracy_high"]) == pytest.approx((low, high))
    table = psctl("compare", "--target", "0.6", "--baseline", "bsp-seed1", db=two_groups).stdout
    line = next(x for x in table.splitlines() if "asp (3 runs)" in x)
    assert f"[{asp['speedup_low']:.2f}, {asp['speedup_high']:.2f}]" in line and expected in line
