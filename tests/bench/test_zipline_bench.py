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
    assert {(row["scenario"], row["n"], row["R"], row["variant"]) for row in rows} == {
        (scenario, n, r, v) for scenario in ("straggler", "paper") for n, r in sizes
        for v in VARIANTS
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
    assert payload["goals"] == []  # n = 1000, R = 150 is not part of a quick run
    lags = payload["decision_lags"]
    assert {(r["n"], r["R"], r["offloaded"]) for r in lags} == {
        (n, r, offloaded) for n, r in bench_zipline.QUICK_LAG_SIZES for offloaded in (True, False)}
    for row in lags:
        assert len(row["max_lag_ms"]) == 2 and row["worst_lag_ms"] > 0
        assert row["median_decision_ms"] > 0 and row["record_bytes"] > 0
    scaling = payload["scaling"]
    assert {(r["n"], r["variant"]) for r in scaling["rows"]} == {
        (n, v) for n in bench_zipline.QUICK_SCALING_WORKERS for v in ("optbs", "rowbs")}
    assert all(r["median_ms"] > 0 for r in scaling["rows"])
    assert set(scaling["exponents_of_n"]) == {"optbs", "rowbs"}


def test_goal_lines_report_the_default_at_the_goal_size_on_each_input() -> None:
    rows = [{"scenario": goal["scenario"], "n": goal["n"], "R": goal["R"],
             "variant": goal["variant"], "status": "measured", "median_ms": median,
             "speedup_vs_zipline": 400.0}
            for goal, median in zip(bench_zipline.GOALS, (0.5, 44.0), strict=True)]
    met, missed = bench_zipline.goal_results(rows)
    assert (met["scenario"], met["met"], missed["scenario"], missed["met"]) == (
        "straggler", True, "paper", False)
    (line,) = [x for x in bench_zipline._goal_lines(met) if x]
    assert "measured 0.50 ms, met; 400.00x the speed of zipline" in line
    (line,) = [x for x in bench_zipline._goal_lines(missed) if x]
    assert line.startswith("Goal on the paper input") and "measured 44.00 ms, not met" in line
    assert bench_zipline.goal_results([{**rows[0], "n": 4}]) == []
