"""The analysis of bench/learning_rules.py on hand-built rows: speedups against fixed-rate SGD,
failed runs shown as failed, and the verdict naming what reached the target in every pass."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import learning_rules as bench  # noqa: E402


def _row(config: str, reached: float | None, status: str = "finished") -> dict[str, Any]:
    return {"config": config, "lr": 0.1, "status": status, "time_to_target_s": reached,
            "best_accuracy": 0.98 if reached else 0.5, "staleness_mean": 2.5,
            "iterations": 100}


def test_table_gives_speedups_against_fixed_rate_sgd_and_shows_failures() -> None:
    rows = [_row(bench.BASELINE, 40.0), _row("SGD + dynsgd", 20.0),
            _row("SGD + split", None, "failed")]
    lines = bench.table(rows, 0.97, 90.0)
    assert lines[0].startswith("| configuration | lr | status | time to 97% |")
    assert "| SGD + dynsgd | 0.1 | finished | 20.0 s | 2.00x | 98.00% | 2.50 | 100 |" in lines
    assert "| SGD + split | 0.1 | failed | not reached |  | 50.00% | 2.50 | 100 |" in lines


def test_verdict_names_the_fastest_and_what_reached_the_target_every_time() -> None:
    passes = [{"results": [_row(bench.BASELINE, 40.0), _row("SGD + dynsgd", 20.0)]},
              {"results": [_row(bench.BASELINE, 30.0), _row("SGD + dynsgd", None)]}]
    verdict = bench._verdict(passes, 0.97)
    assert "per pass: SGD + dynsgd (20.0 s); SGD, fixed rate (none) (30.0 s)" in verdict
    assert verdict.endswith("in every pass: SGD, fixed rate (none).")
