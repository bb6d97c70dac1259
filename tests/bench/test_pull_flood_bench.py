"""bench/pull_flood.py: each attack window is judged against the baseline window before it; the
summary takes the median ratio and the largest RSS growth over passes, and says if goals hold."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import pull_flood as bench  # noqa: E402


def _run(transport: str, ratio: float | None, growth: float,
         after: float | None = None) -> dict[str, Any]:
    return {"transport": transport, "loadavg_1min": [1.5, 3.25], "windows": [
        {"attack": "flood", "connections": 16, "ratio": ratio, "rss_growth_mb": growth,
         "rss_after_growth_mb": after}]}


def test_summary_is_the_median_ratio_and_the_largest_growth_over_passes() -> None:
    passes = [{"runs": [_run("tcp", 0.4, 10.0, 2.0), _run("websocket", 0.9, 70.0)]},
              {"runs": [_run("websocket", 0.7, 5.0), _run("tcp", 0.8, 12.0, -1.0)]},
              {"runs": [_run("tcp", 0.6, 1.0), _run("websocket", None, 1.0)]}]
    summary = bench.summarise(passes)
    assert summary["tcp / flood / 16"] == {"rate_ratio": pytest.approx(0.6),
                                           "rss_growth_mb": 12.0, "rss_after_mb": 2.0,
                                           "rate_goal_met": True, "memory_goal_met": True}
    websocket = summary["websocket / flood / 16"]
    assert websocket["rate_ratio"] == pytest.approx(0.8)
    assert (websocket["rss_growth_mb"], websocket["memory_goal_met"]) == (70.0, False)
    assert websocket["rss_after_mb"] is None  # never measured: not made up


def test_the_docs_row_says_which_goals_are_not_met() -> None:
    passes = [{"runs": [_run("tcp", 0.3, 10.0, 0.5)]}]
    payload = {"passes_run": 2, "window_s": 4.0, "passes": passes,
               "summary": bench.summarise(passes)}
    body = bench.docs_body(payload)
    assert body.splitlines()[-1] == "| tcp | flood | 16 | 0.30 | 10.0 | 0.5 | NOT met |"
    assert "load average (1 min) 1.5-3.2" in body
