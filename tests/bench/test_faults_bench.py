"""bench/faults.py: each faulty run is compared with its own model's clean run of the same pass,
and the medians are taken over passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import faults as bench  # noqa: E402


def _run(name: str, seconds: float, accuracy: float) -> dict[str, object]:
    return {"scenario": name, "training_s": seconds, "final_accuracy": accuracy}


def test_summary_divides_by_the_clean_run_of_the_same_model_and_pass() -> None:
    passes = [
        {"runs": [_run("clean BSP", 10.0, 0.97), _run("BSP, 1 replica", 12.0, 0.97),
                  _run("clean ASP", 8.0, 0.96), _run("ASP, drop 1% + delay 5 ms", 12.0, 0.95)]},
        {"runs": [_run("ASP, drop 1% + delay 5 ms", 9.0, 0.97), _run("clean ASP", 6.0, 0.96),
                  _run("BSP, 1 replica", 15.0, 0.97), _run("clean BSP", 10.0, 0.97)]},
    ]
    summary = bench.summarise(passes)
    assert set(summary) == {"BSP, 1 replica", "ASP, drop 1% + delay 5 ms"}
    assert summary["BSP, 1 replica"]["time_ratio"] == pytest.approx((1.2 + 1.5) / 2)
    assert summary["ASP, drop 1% + delay 5 ms"]["time_ratio"] == pytest.approx(1.5)
    assert summary["ASP, drop 1% + delay 5 ms"]["accuracy_delta"] == pytest.approx(0.0)


def test_every_kill_is_timed_from_the_option() -> None:
    import argparse

    args = argparse.Namespace(kill_after=12.5, dataset="digits", data_dir=None, epochs=1)
    values = bench._values(args, bench.SCENARIOS["BSP, 1 replica, server 0 killed"], "x")
    assert values["fault.inject"] == ["kill:server:0@12.5s"]
    assert values["cluster.replicas"] == 1
