"""Smoke test of bench/peers.py: its quick mode trains DDP (gloo) and psctl BSP on digits to a
target, leaves the docs alone and writes results of the expected shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import peers  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_quick_run_compares_ddp_and_psctl(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    docs_before = peers.C.DOCS.read_text()
    payload = peers.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert peers.C.DOCS.read_text() == docs_before
    runs = payload["passes"][0]["runs"]["2"]
    assert set(runs) == {"ddp", "psctl bsp"}
    for run in runs.values():
        assert run["samples_per_s"] > 0 and run["training_s"] > 0
        assert run["to_target_s"] is not None  # digits reaches 80 % in seconds
        assert max(accuracy for _, accuracy in run["evaluations"]) >= 0.8
    assert runs["ddp"]["iterations"] >= 5  # rank 0 looks at the time every 5 iterations
    verdict = payload["verdicts"]["2"]
    ratio = runs["psctl bsp"]["samples_per_s"] / runs["ddp"]["samples_per_s"]
    assert verdict["bsp_throughput_ratio"] == pytest.approx(ratio)
    assert verdict["throughput_met"] == (ratio >= peers.THROUGHPUT_GOAL)
