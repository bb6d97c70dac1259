"""bench/startup.py's summary, in process: medians per size and start-up kind, the first
iteration against ``import torch``, the memory each added worker costs (the launches themselves
are the benchmark's, not the fast tier's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import startup  # noqa: E402

MIB = 2**20


def _run(workers: int, template: bool, first: float, pss_mib: float) -> dict[str, object]:
    return {"workers": workers, "servers": 1, "template": template, "first_iteration_s": first,
            "command_s": first + 1, "cpu_s": 2 * first, "pss_bytes": pss_mib * MIB,
            "rss_bytes": 3 * pss_mib * MIB, "processes": workers + 3}


def test_medians_per_size_and_kind_ratios_and_memory_per_added_worker() -> None:
    passes = [
        {"import_torch_s": 2.0, "runs": [_run(2, True, 3.0, 500), _run(2, False, 6.0, 1000),
                                         _run(16, True, 5.0, 850)]},
        {"import_torch_s": 4.0, "runs": [_run(2, False, 8.0, 1100), _run(2, True, 4.0, 520),
                                         _run(16, True, 6.0, 870)]},
        {"import_torch_s": 3.0, "runs": [_run(2, True, 5.0, 480), _run(2, False, 7.0, 900),
                                         _run(16, True, 7.0, 860)]},
    ]
    summary = startup.summarise(passes)
    assert summary["import_torch_s"] == 3.0
    two, sixteen = summary["sizes"]["2"], summary["sizes"]["16"]
    assert two["template"]["first_iteration_s"] == 4.0
    assert two["fresh"]["first_iteration_s"] == 7.0
    assert two["first_iteration_ratio"] == pytest.approx(4.0 / 7.0)
    assert two["first_iteration_over_import_torch"] == pytest.approx(4.0 / 3.0)
    assert "fresh" not in sixteen  # not run: no ratio, no fresh row
    assert "first_iteration_ratio" not in sixteen
    # 860 MiB for 16 workers against 500 MiB for 2: 360 MiB over 14 added workers.
    assert sixteen["template"]["pss_per_added_worker_bytes"] == pytest.approx(360 * MIB / 14)
    rows = startup._rows(summary)
    assert any(row.startswith("| 16 | forked from the template |") and "26 MiB |" in row
               for row in rows)
