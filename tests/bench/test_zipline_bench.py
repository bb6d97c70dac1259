"""Smoke test of bench/zipline.py: its quick mode runs and writes results of the expected shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import zipline as bench_zipline  # noqa: E402
from engine.consistency.zipline import VARIANTS  # noqa: E402


def test_quick_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "zipline.json"
    docs_before = bench_zipline.C.DOCS.read_text()
    payload = bench_zipline.main(["--quick", "--out", str(out)])

    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert bench_zipline.C.DOCS.read_text() == docs_before  # quick runs leave the docs alone
    rows = payload["results"]
    sizes = {(n, r) for n in bench_zipline.QUICK_WORKERS for r in bench_zipline.QUICK_WIDTHS}
    assert {(row["n"], row["R"], row["variant"]) for row in rows} == {
        (n, r, v) for n, r in sizes for v in VARIANTS
    }
    for row in rows:
        if row["status"] == "measured":
            assert row["median_ms"] > 0 and row["ns_per_R_n_log2n"] > 0
            assert len(row["samples_ms"]) == payload["parameters"]["rounds"]
            assert row["speedup_vs_zipline"] > 0
        else:
            assert row["status"] == "skipped" and row["reason"]
    skipped = {(row["n"], row["variant"]) for row in rows if row["status"] == "skipped"}
    assert skipped == {(16, "brute")}  # 15**16 choices; 15**4 is measured
    assert set(payload["exponents_of_n"]) == set(VARIANTS) - {"brute"}
    assert payload["goal"] is None  # n = 1000, R = 150 is not part of a quick run


def test_goal_line_reports_the_default_at_the_goal_size() -> None:
    goal = bench_zipline.GOAL
    row = {"n": goal["n"], "R": goal["R"], "variant": goal["variant"], "status": "measured"}
    result = bench_zipline.goal_result([{**row, "median_ms": 0.5, "speedup_vs_zipline": 400.0}])
    assert result is not None and result["met"] is True
    (line,) = [x for x in bench_zipline._goal_lines(result) if x]
    assert "measured 0.50 ms, met; 400.00x the speed of zipline" in line
    assert bench_zipline.goal_result([{**row, "n": 4}]) is None
