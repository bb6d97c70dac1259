"""A study with ``repeat = 3`` over BSP and ASP on the simulated cluster reports each point's
mean with its 95 % interval over seeds, and ASP's ratio to BSP paired by seed with a verdict,
in report.md and summary.json (issue 41, acceptance 2). The numbers are recomputed here from
the study's own rows with scipy's Student t."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from tests.conftest import psctl
from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STUDY = """
[study]
name = "seeds"
title = "BSP against ASP over three seeds"
target = 0.5
repeat = 3

[base]
cluster.backend = "sim"
cluster.workers = 4
cluster.servers = 1
data.dataset = "digits"
model.hidden = [32]
stop.budget = "3s"
regime.compute_ms = 20.0
heterogeneity.stragglers = [{ rank = 0, factor = 3.0 }]
eval.interval_s = 0.5

[[axis]]
name = "sync"
  [[axis.values]]
  label = "BSP"
  set = { "sync.model" = "bsp" }
  [[axis.values]]
  label = "ASP"
  set = { "sync.model" = "asp" }
"""


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], str, Path]:
    folder = tmp_path_factory.mktemp("seeds")
    (folder / "seeds.toml").write_text(STUDY)
    done = psctl("study", str(folder / "seeds.toml"), db=folder / "experiments.db")
    assert done.returncode == 0, done.stderr
    out = folder / "results" / "seeds"
    return (json.loads((out / "summary.json").read_text()), (out / "report.md").read_text(),
            folder / "experiments.db")


def test_each_point_has_its_mean_and_student_t_interval(
        summary: tuple[dict[str, object], str, Path]) -> None:
    data, report, _ = summary
    rows = data["rows"]
    over = data["over_seeds"]
    assert isinstance(rows, list) and isinstance(over, dict)
    assert over["baseline"] == {"sync": "BSP"}
    for point in over["points"]:
        mine = [r for r in rows if r["labels"] == point["labels"]]
        assert sorted(point["seeds"]) == sorted(r["seed"] for r in mine) and len(mine) == 3
        values = [r["samples_per_s"] for r in mine]
        mean, half = statistics.fmean(values), (stats.t.ppf(0.975, 2) * statistics.stdev(values)
                                                 / math.sqrt(3))
        found = point["metrics"]["samples_per_s"]
        assert found["mean"] == pytest.approx(mean)
        assert (found["low"], found["high"]) == pytest.approx((mean - half, mean + half))
    assert "## Over seeds" in report and "Student t" in report



def test_accuracy_at_each_mark_of_the_budget_has_its_interval(
        summary: tuple[dict[str, object], str, Path]) -> None:
    data, report, db = summary
    rows, over = data["rows"], data["over_seeds"]
    assert isinstance(rows, list) and isinstance(over, dict)
    assert all(set(r["mark_accuracy"]) == {"25%", "50%", "75%", "100%"} for r in rows)
    for row in rows:  # the evaluation nearest to 0.75 s of training (a quarter of 3 s)
        found = query(db, "SELECT accuracy FROM evaluations e WHERE run_id = ?1 ORDER BY "
                          "abs(at - (SELECT min(started_at) FROM iterations WHERE run_id = ?1) "
                          "- 0.75), at LIMIT 1", row["run_id"])
        assert row["mark_accuracy"]["25%"] == pytest.approx(found[0][0])
    for point in over["points"]:
        values = [r["mark_accuracy"]["50%"] for r in rows if r["labels"] == point["labels"]]
        mean, half = statistics.fmean(values), (stats.t.ppf(0.975, 2) * statistics.stdev(values)
                                                 / math.sqrt(3))
        found = point["metrics"]["acc@50%"]
        assert found["mean"] == pytest.approx(mean)
        if half > 0:
            assert (found["low"], found["high"]) == pytest.approx((mean - half, mean + half))
    assert "acc at 75%" in report


def test_asp_against_bsp_is_a_paired_ratio_with_a_verdict(
        summary: tuple[dict[str, object], str, Path]) -> None:
    data, report, _ = summary
    rows, over = data["rows"], data["over_seeds"]
    assert isinstance(rows, list) and isinstance(over, dict)
    asp = next(p for p in over["points"] if p["labels"] == {"sync": "ASP"})
    ratio = asp["versus_baseline"]["samples_per_s"]
    rate = {(r["labels"]["sync"], r["seed"]): r["samples_per_s"] for r in rows}
    logs = [math.log(rate[("ASP", s)] / rate[("BSP", s)]) for s in asp["seeds"]]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(logs) / math.sqrt(3)
    assert ratio["ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (ratio["low"], ratio["high"]) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)))
    expected = ("higher" if ratio["low"] > 1 else "lower" if ratio["high"] < 1
                else "no difference at 95 %")
    assert ratio["verdict"] == expected
    (line,) = [x for x in report.splitlines() if x.startswith("| ASP |") and "x [" in x]
    assert expected in line
