"""Smoke test of bench/update.py: its quick mode runs, leaves the docs alone and writes results
of the expected shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import update as bench_update  # noqa: E402


def test_quick_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "update.json"
    docs_before = bench_update.C.DOCS.read_text()
    payload = bench_update.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert bench_update.C.DOCS.read_text() == docs_before
    samples = payload["samples_ms"]
    assert {"before", "after", "after, BLAS on 2 threads"} <= set(samples)
    assert all(len(values) == 3 and min(values) > 0 for values in samples.values())
    assert set(payload["ratios_to_before"]) == {"after", "after, BLAS on 2 threads"}
    assert payload["goal_met"] == (payload["ratios_to_before"]["after"] <= 0.5)
