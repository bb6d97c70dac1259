"""Acceptance 4 of the simulator issue: every shipped study runs to completion at its reduced
size (``--smoke``), on the simulated cluster, and reports every run finished; run as the README
says, from the repository with ``--data-dir ../shared/data`` and no PSCTL_DATA_DIR (acceptance
4 of issue 37)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, psctl

STUDIES = sorted((Path(__file__).parent.parent / "studies").glob("*.toml"))


def test_the_seed_studies_are_shipped() -> None:
    names = {study.stem for study in STUDIES}
    assert {"elastic-bsp", "ssp-transient", "bounded-delay", "downpour-adagrad",
            "downpour-sparse", "dynsgd", "pruning"} <= names


@pytest.mark.integration
@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.stem)
def test_every_study_runs_in_smoke_size(study: Path, tmp_path: Path, mnist_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PSCTL_DATA_DIR", raising=False)
    data_dir = os.path.relpath(mnist_dir.parent, REPO)  # ../shared/data in a checkout
    done = psctl("study", str(study.relative_to(REPO)), "--smoke", "--data-dir", data_dir,
                 "--out", str(tmp_path / "out"), db=tmp_path / "studies.db", timeout=600,
                 cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"], summary
    assert all(run["status"] == "finished" for run in summary["rows"])
    assert (tmp_path / "out" / "report.md").read_text().count("| finished |") == \
        len(summary["rows"])
