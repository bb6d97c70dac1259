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


@pytest.mark.integration  # real DDP and psctl processes; the findings below are in-process
@pytest.mark.timeout(300)
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
        # Whether and when it reached the target is the benchmark's result, not a test's.
        assert run["to_target_s"] is None or run["to_target_s"] > 0
        assert run["evaluations"] and all(0 <= a <= 1 for _, a in run["evaluations"])
    assert runs["ddp"]["iterations"] >= 5  # rank 0 looks at the time every 5 iterations
    verdict = payload["verdicts"]["2"]
    ratio = runs["psctl bsp"]["samples_per_s"] / runs["ddp"]["samples_per_s"]
    assert verdict["bsp_throughput_ratio"] == pytest.approx(ratio)
    assert verdict["throughput_met"] == (ratio >= peers.THROUGHPUT_GOAL)


def _summary(rates: dict[str, dict[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
    return {count: {name: {"samples_per_s": rate} for name, rate in row.items()}
            for count, row in rates.items()}


@pytest.mark.parametrize("wait_free_2, half_4, explains", [
    (0.9, 1.08, {"wait-free", "float16"}),
    (1.1, 1.08, {"float16"}),       # wait-free paid off somewhere: no claim that it cannot
    (0.9, 1.01, {"wait-free"}),     # float16 helped less with more workers: not said
])
def test_findings_explain_only_what_the_numbers_show(
        wait_free_2: float, half_4: float, explains: set[str]) -> None:
    summary = _summary({
        "2": {"ddp": 5000, "psctl bsp": 4000, "psctl bsp, float16 wire": 4000 * 1.03,
              "psctl bsp, wait-free": 4000 * wait_free_2},
        "4": {"ddp": 5000, "psctl bsp": 4000, "psctl bsp, float16 wire": 4000 * half_4,
              "psctl bsp, wait-free": 4000 * 0.95}})
    (paragraph,) = peers._findings(summary)
    text = " ".join(paragraph.split())  # wrapped at 100 columns
    assert f"float16 wire {half_4:.2f}x" in text and f"wait-free {wait_free_2:.2f}x" in text
    assert ("helps more with 4 workers" in text) == ("float16" in explains)
    assert ("(wait-free) gains nothing" in text) == ("wait-free" in explains)


def test_findings_without_other_configurations_say_nothing() -> None:
    assert peers._findings(_summary({"2": {"ddp": 5000, "psctl bsp": 4000}})) == []
