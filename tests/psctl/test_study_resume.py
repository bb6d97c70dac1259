"""``psctl study FILE --resume STUDY_ID``: an invocation that did not finish continues where it
stopped: the points whose run finished are kept, the others run under the same study id, and
the report covers them all (issue 41, part 5)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import psctl
from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STUDY = """
[study]
name = "again"
title = "Three points, one run again"
target = 0.5

[base]
cluster.backend = "sim"
cluster.workers = 2
cluster.servers = 1
data.dataset = "digits"
model.hidden = [32]
train.epochs = 2
regime.compute_ms = 10.0

[[axis]]
name = "sync"
  [[axis.values]]
  label = "BSP"
  set = { "sync.model" = "bsp" }
  [[axis.values]]
  label = "ASP"
  set = { "sync.model" = "asp" }
  [[axis.values]]
  label = "SSP"
  set = { "sync.model" = "ssp" }
"""


def test_a_resumed_study_runs_only_what_did_not_finish(tmp_path: Path) -> None:
    study, db = tmp_path / "again.toml", tmp_path / "experiments.db"
    study.write_text(STUDY)
    first = psctl("study", str(study), db=db)
    assert first.returncode == 0, first.stderr
    (study_id,) = re.findall(r"study again \(([0-9a-f]{8})\)", first.stderr)
    # as if the study had been stopped before its last point: that run is gone
    (last,) = query(db, "SELECT id FROM runs WHERE name = 'again-ssp'")[0]
    assert psctl("runs", "rm", last, "--yes", db=db).returncode == 0
    again = psctl("study", str(study), "--resume", study_id, db=db)
    assert again.returncode == 0, again.stderr
    assert "2 finished before, kept" in again.stderr
    assert "1 of 1: sync=SSP" in again.stderr  # only the missing point ran
    names = sorted(n for (n,) in query(db, "SELECT name FROM runs"))
    assert names == ["again-asp", "again-bsp", "again-ssp"]
    tagged = {n: v for n, v in query(db, "SELECT r.name, t.value FROM runs r JOIN tags t ON "
                                         "t.run_id = r.id AND t.key = 'study_id'")}
    assert set(tagged.values()) == {study_id}
    summary = json.loads((tmp_path / "results" / "again" / "summary.json").read_text())
    assert summary["complete"] and summary["study_id"] == study_id
    assert [r["labels"]["sync"] for r in summary["rows"]] == ["BSP", "ASP", "SSP"]


def test_resume_names_an_invocation_that_is_not_there(tmp_path: Path) -> None:
    study = tmp_path / "again.toml"
    study.write_text(STUDY)
    done = psctl("study", str(study), "--resume", "deadbeef", db=tmp_path / "x.db")
    assert done.returncode != 0 and "study_id=deadbeef" in done.stderr
