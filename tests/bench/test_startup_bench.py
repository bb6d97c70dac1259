"""bench/startup.py's summary, in process: medians per start-up kind and their ratio (the
launches themselves are the benchmark's, not the fast tier's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import startup  # noqa: E402


def _run(template: bool, first: float, command: float, cpu: float) -> dict[str, object]:
    return {"template": template, "first_iteration_s": first, "command_s": command,
            "cpu_s": cpu}


def test_medians_per_kind_and_the_ratio_of_first_iterations() -> None:
    passes = [
        {"import_torch_s": 2.0, "runs": [_run(True, 3.0, 5.0, 4.0), _run(False, 6.0, 8.0, 9.0)]},
        {"import_torch_s": 4.0, "runs": [_run(False, 8.0, 9.0, 10.0), _run(True, 4.0, 6.0, 5.0)]},
        {"import_torch_s": 3.0, "runs": [_run(True, 5.0, 7.0, 6.0), _run(False, 7.0, 9.5, 11.0)]},
    ]
    summary = startup.summarise(passes)
    assert summary["import_torch_s"] == 3.0
    assert summary["template"] == {"first_iteration_s": 4.0, "command_s": 6.0, "cpu_s": 5.0}
    assert summary["fresh"] == {"first_iteration_s": 7.0, "command_s": 9.0, "cpu_s": 10.0}
    assert summary["first_iteration_ratio"] == pytest.approx(4.0 / 7.0)
