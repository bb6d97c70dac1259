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


def _try(signal: str, spurious: int = 0, recovery: float | None = 0.5,
         status: str = "finished", best: float | None = 0.975) -> dict[str, object]:
    return {"signal": signal, "spurious_fencing": spurious, "recovery_s": recovery,
            "fenced_after_s": 0.9 if signal == "SIGSTOP" else None, "status": status,
            "best_accuracy": best}


def test_under_load_a_try_counts_only_when_every_goal_holds() -> None:
    from bench import faults_load

    rows = [_try("SIGKILL"), _try("SIGKILL", spurious=1), _try("SIGKILL", recovery=3.5),
            _try("SIGKILL", status="failed"), _try("SIGKILL", best=0.96),
            _try("SIGKILL", recovery=None), _try("SIGSTOP", recovery=4.0), _try("SIGSTOP",
                                                                             spurious=2)]
    summary = faults_load.verdicts(rows, 0.97)
    assert (summary["kills_ok"], summary["kills"]) == (1, 6)
    # a stop's recovery includes its detection: the 3 s goal is the kill's
    assert (summary["stops_ok"], summary["stops"]) == (1, 2)
    assert summary["spurious_fencing"] == 3
    assert summary["recovery_s"] == [0.5, 0.5, 0.5, 0.5, 3.5]


def test_under_load_runs_are_replicated_asp_at_the_target() -> None:
    import argparse

    from bench import faults_load

    args = argparse.Namespace(dataset="mnist", data_dir="d", epochs=10, target=0.97)
    values = faults_load._values(args, "x")
    assert values["cluster.replicas"] == 1 and values["sync.model"] == "asp"
    assert (values["cluster.workers"], values["cluster.servers"]) == (2, 2)
    assert values["stop.target_accuracy"] == 0.97
