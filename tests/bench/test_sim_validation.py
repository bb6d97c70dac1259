"""bench/sim_validation.py: its summaries, ratios and table on hand-built figures; its quick mode
runs a real and a simulated run and writes results of the expected shape (how close they are is
the benchmark's verdict, too noisy for CI)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import sim_validation as bench  # noqa: E402

KEY = "this machine | 3x straggler | BSP"
ASP = "this machine | 3x straggler | ASP"


def figures(samples: float, idle: float = 0.3, stale: float = 0.0,
            reached: float | None = 2.0) -> dict[str, Any]:
    return {"samples_per_s": samples, "idle_fraction": idle, "staleness": stale,
            "time_to_target_s": reached}


def test_each_figure_is_the_real_mean_and_interval_beside_the_simulators_error() -> None:
    passes = [{KEY: figures(1000.0, 0.30)}, {KEY: figures(1100.0, 0.34)},
              {KEY: figures(900.0, 0.32)}]
    (row,) = bench.summarise(passes, {KEY: figures(1250.0, 0.40, reached=None)})
    assert row["case"] == KEY and row["passes"] == 3
    samples = row["samples_per_s"]
    assert samples["real"]["mean"] == pytest.approx(1000.0)
    assert samples["real"]["low"] < 1000.0 < samples["real"]["high"]
    assert samples["error"] == pytest.approx(0.25)
    assert row["idle_fraction"]["error"] == pytest.approx(0.08)  # absolute: a fraction
    assert row["time_to_target_s"]["sim"] is None and row["time_to_target_s"]["error"] is None


def test_the_bsp_over_asp_ratio_is_paired_by_pass() -> None:
    passes = [{KEY: figures(800.0), ASP: figures(1000.0)},
              {KEY: figures(880.0), ASP: figures(1100.0)}]
    (pair,) = bench.ratios(passes, {KEY: figures(900.0), ASP: figures(1000.0)})
    assert pair["real"]["mean"] == pytest.approx(0.8) and pair["passes"] == 2
    assert pair["sim"] == pytest.approx(0.9)
    assert pair["error"] == pytest.approx(0.125)
    table = bench.table(bench.summarise(passes, {KEY: figures(900.0), ASP: figures(1000.0)}),
                        [pair])
    assert "| this machine | 3x straggler | BSP | 840 [" in table
    assert "| this machine | 3x straggler | 0.80 [0.80, 0.80] | 0.90 | +12 % |" in table


@pytest.mark.integration  # starts a real run's processes, then a simulated run
@pytest.mark.timeout(180)
def test_quick_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "sim_validation.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (real,) = result["passes"]
    assert set(real) == set(result["sim"]) == {KEY}
    for measured in (real[KEY], result["sim"][KEY]):
        assert measured["samples_per_s"] > 0 and 0 <= measured["idle_fraction"] <= 1
    (row,) = result["summary"]
    assert row["samples_per_s"]["error"] is not None
