"""bench/lbfgs.py's reading of a run: accuracy at each mark, and the verdict it writes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import lbfgs as bench_lbfgs  # noqa: E402


def run(method: str, accuracies: list[float]) -> dict[str, Any]:
    marks = [*accuracies, *[None] * (len(bench_lbfgs.MARKS_S) - len(accuracies))]
    return {"method": method, "best_accuracy": max(accuracies),
            "at_marks": {str(m): a for m, a in zip(bench_lbfgs.MARKS_S, marks, strict=True)}}


def test_accuracy_at_a_mark_is_the_last_evaluation_at_or_before_it() -> None:
    curve = [(4.0, 0.5), (14.9, 0.7), (15.0, 0.8), (31.0, 0.9)]
    assert bench_lbfgs._at(curve, 15) == 0.8
    assert bench_lbfgs._at(curve, 30) == 0.8
    assert bench_lbfgs._at(curve, 3) is None


def test_the_verdict_names_the_winner_only_when_every_pass_agrees() -> None:
    ahead = {"passes": [{"runs": [run("lbfgs", [0.6, 0.7]), run("downpour-adagrad",
                                                                   [0.9, 0.95])]}] * 2}
    assert bench_lbfgs.verdict(ahead).startswith("Winner here: downpour-adagrad, in every pass")
    crossing = {"passes": [{"runs": [run("lbfgs", [0.6, 0.99]), run("downpour-adagrad",
                                                                      [0.9, 0.95])]}] * 2}
    assert "by best accuracy within the budget: lbfgs" in bench_lbfgs.verdict(crossing)
    split = {"passes": [ahead["passes"][0], crossing["passes"][0]]}
    assert bench_lbfgs.verdict(split).startswith("No clear winner here")
