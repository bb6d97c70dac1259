"""bench/run_stops.py's verdicts, in process: a median past the goal, or a run that never ended,
is a miss it reports (the runs themselves are the benchmark's, not the fast tier's)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import run_stops  # noqa: E402


def _passes(*times: dict[str, float | None]) -> list[dict[str, object]]:
    return [{"runs": [{"deed": deed, "processes": 6, "ended_s": seconds}
                      for deed, seconds in one.items()]} for one in times]


def test_medians_within_the_goal_are_met() -> None:
    summary = run_stops.summarise(_passes(
        {"rm --force": 1.0, "row deleted": 2.0, "recorder refuses": 3.0},
        {"rm --force": 3.0, "row deleted": 2.5, "recorder refuses": 9.0},
        {"rm --force": 2.0, "row deleted": 20.0, "recorder refuses": 4.0}))
    assert summary["rm --force"] == {"median_s": 2.0, "runs": 3, "not_ended": 0,
                                     "goal_s": run_stops.GOAL_S, "met": True}
    assert summary["row deleted"]["median_s"] == 2.5 and summary["row deleted"]["met"]
    assert summary["recorder refuses"]["median_s"] == 4.0


def test_a_slow_median_or_a_run_that_never_ended_is_a_miss() -> None:
    summary = run_stops.summarise(_passes(
        {"rm --force": 11.0, "row deleted": 1.0, "recorder refuses": None},
        {"rm --force": 12.0, "row deleted": 1.0, "recorder refuses": 1.0}))
    assert summary["rm --force"]["met"] is False and summary["rm --force"]["median_s"] == 11.5
    assert summary["recorder refuses"] == {"median_s": 1.0, "runs": 2, "not_ended": 1,
                                           "goal_s": run_stops.GOAL_S, "met": False}
    assert summary["row deleted"]["met"] is True
