"""docs/reproductions.md quotes measured numbers only: every table row that names a run (its id's
first 8 characters in backticks) shows that run's final accuracy and time to target as the
study's summary.json in studies/results/ recorded them, and every study it cites is shipped."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conftest import REPO

DOC = (REPO / "docs" / "reproductions.md").read_text()
RESULTS = REPO / "studies" / "results"


def _runs() -> dict[str, dict[str, Any]]:
    runs = {}
    for summary in RESULTS.glob("*/summary.json"):
        for row in json.loads(summary.read_text())["rows"]:
            runs[row["run_id"][:8]] = row
    return runs


def test_every_quoted_run_shows_its_recorded_numbers() -> None:
    runs = _runs()
    rows = [line for line in DOC.splitlines() if re.search(r"`[0-9a-f]{8}`", line)]
    assert len(rows) >= 10
    for line in rows:
        (run_id,) = re.findall(r"`([0-9a-f]{8})`", line)
        assert run_id in runs, f"{run_id} is in no studies/results/*/summary.json"
        run = runs[run_id]
        assert f"{100 * run['final_accuracy']:.2f} %" in line, line
        reached = run["time_to_target_s"]
        assert (f"{reached:.1f}" if reached is not None else "not reached") in line, line


def test_the_cited_studies_are_shipped_with_their_results() -> None:
    for name in set(re.findall(r"psctl study studies/([a-z-]+)\.toml", DOC)):
        assert (REPO / "studies" / f"{name}.toml").exists()
        assert (RESULTS / name / "summary.json").exists(), name
        assert (RESULTS / name / "report.md").exists(), name
