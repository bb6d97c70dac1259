"""The analysis of bench/range_size.py on hand-built rows: ratios against range size off in the
same pass, failed runs kept in the table, and the verdict's best size against the noise."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import range_size as bench  # noqa: E402


def _row(config: str, speed: float | None, blocked: float | None = 0.02,
         status: str = "finished") -> dict[str, Any]:
    return {"config": config, "status": status, "samples_per_s": speed,
            "push_pull_s": blocked, "push_s": None if blocked is None else blocked / 2,
            "pull_s": None if blocked is None else blocked / 2, "wait_s": 0.004,
            "compute_s": 0.011, "iterations": 100 if speed else 0}


def _pass(speeds: dict[str, float | None]) -> dict[str, Any]:
    return {"results": [_row(label, speed) for label, speed in speeds.items()]}


def test_table_gives_ratios_against_off_in_sizes_order_and_shows_failures() -> None:
    rows = [_row("500", 500.0, 0.04), _row(bench.BASELINE, 1000.0, 0.02),
            _row("10000", None, None, "failed")]
    lines = bench.table(rows)
    assert lines[0].startswith("| range size (keys) | status | samples/s | vs off |")
    assert lines[2] == ("| off | finished | 1,000 | 1.00x | 20.0 | 1.00x | 10.0 | 10.0 | 4.0 | "
                        "11.0 | 100 |")
    assert lines[3] == "| 10000 | failed |  |  |  |  |  |  | 4.0 | 11.0 | 0 |"
    assert lines[4] == ("| 500 | finished | 500 | 0.50x | 40.0 | 2.00x | 20.0 | 20.0 | 4.0 | "
                        "11.0 | 100 |")


def test_verdict_says_when_the_best_size_is_beyond_the_noise() -> None:
    passes = [_pass({"off": 100.0, "10000": 130.0, "500": 90.0}),
              _pass({"off": 100.0, "10000": 125.0, "500": 95.0})]
    found = bench.summary(passes)
    assert found["best"] == "10000"
    assert abs(found["noise"] - 0.05) < 1e-9
    text = bench.verdict(passes)
    assert "median over 2 passes: off 1.00x, 10000 1.27x, 500 0.93x" in text
    assert "Best here: 10000 keys per frame, beyond the noise: its worst pass was 1.25x" in text


def test_verdict_says_when_it_is_not_and_when_off_wins() -> None:
    close = [_pass({"off": 100.0, "10000": 104.0, "500": 80.0}),
             _pass({"off": 100.0, "10000": 101.0, "500": 95.0})]
    assert "10000 keys per frame, not beyond the noise: its worst pass was 1.01x" in \
        bench.verdict(close)
    slower = [_pass({"off": 100.0, "10000": 90.0}), _pass({"off": 100.0, "10000": 92.0})]
    assert bench.verdict(slower).endswith(
        "no size was faster than the baseline. The closest, 10000 keys, was 0.92x at best, "
        "beyond the noise.")
    near = [_pass({"off": 100.0, "10000": 90.0}), _pass({"off": 100.0, "10000": 99.0})]
    assert bench.verdict(near).endswith("was 0.99x at best, not beyond the noise.")
    assert bench.verdict([]) == "No configuration recorded a throughput."
