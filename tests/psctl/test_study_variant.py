"""``psctl study FILE`` on another backend, for some axis values, at an earlier tuning's best
(--backend, --only, --tuned-from): checked on a dry run, which builds every point's config."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import psctl_in_process
from tests.study_text import sync_axis

STUDY = """
[study]
name = "variant"
title = "two models, tuned"
target = 0.5

[base]
cluster.backend = "sim"
data.dataset = "digits"
regime.compute_ms = 20.0
sim.costs = "given"
sim.server_ms = 1.0

""" + sync_axis("bsp", "asp") + """

[tune]
seeds = 1
  [[tune.param]]
  key = "optimizer.lr"
  values = [0.05, 0.2]
"""


def study(tmp_path: Path) -> Path:
    path = tmp_path / "variant.toml"
    path.write_text(textwrap.dedent(STUDY))
    return path


def earlier(tmp_path: Path, best: dict[str, float]) -> Path:
    folder = tmp_path / "earlier"
    folder.mkdir()
    points = [{"labels": {"sync": sync}, "best": {"optimizer.lr": lr}} for sync, lr in
              best.items()]
    (folder / "summary.json").write_text(json.dumps({"tuning": {"points": points}}))
    return folder


def test_each_point_runs_at_its_earlier_best_on_real_processes(tmp_path: Path) -> None:
    done = psctl_in_process("study", str(study(tmp_path)), "--backend", "local",
                            "--tuned-from", str(earlier(tmp_path, {"BSP": 0.2, "ASP": 0.05})),
                            "--dry-run", db=tmp_path / "db.db")
    assert done.returncode == 0, done.stderr
    assert "tune" not in done.stdout  # skipped: the points are pinned
    lines = [line for line in done.stdout.splitlines() if "[sync=" in line]
    assert "sync.model=bsp optimizer.lr=0.2" in lines[0]
    assert "sync.model=asp optimizer.lr=0.05" in lines[1]


def test_only_keeps_the_named_values_and_refuses_others(tmp_path: Path) -> None:
    file, db = study(tmp_path), tmp_path / "db.db"
    kept = psctl_in_process("study", str(file), "--only", "sync=ASP", "--dry-run", db=db)
    assert kept.returncode == 0 and "variant: 1 points" in kept.stdout
    for only, says in (("sync=SSP", "axis sync has no value 'SSP'"),
                       ("workers=2", "no axis workers"), ("sync", "write AXIS=LABEL")):
        refused = psctl_in_process("study", str(file), "--only", only, "--dry-run", db=db)
        assert refused.returncode != 0 and says in refused.stderr, (only, refused.stderr)


def test_a_tuning_that_lacks_a_point_is_named(tmp_path: Path) -> None:
    done = psctl_in_process("study", str(study(tmp_path)), "--tuned-from",
                            str(earlier(tmp_path, {"BSP": 0.2})), "--dry-run",
                            db=tmp_path / "db.db")
    assert done.returncode != 0 and "holds no tuning of point sync=ASP" in done.stderr
    missing = psctl_in_process("study", str(study(tmp_path)), "--tuned-from",
                               str(tmp_path / "nowhere"), "--dry-run", db=tmp_path / "db.db")
    assert missing.returncode != 0 and "cannot read its tuning" in missing.stderr
