"""Runs that cannot go on end at once and say why in words: a diverged model, a checkpoint a
server refuses, servers past their memory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_learning_rate_that_diverges_ends_the_run_saying_so(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    ended = subprocess.run(
        [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers", "2",
         "--servers", "1", "--epochs", "20", "--lr", "50", "--db", str(db)],
        capture_output=True, text=True, cwd=tmp_path, timeout=150,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="200"))
    assert ended.returncode != 0
    assert "the model diverged: worker" in ended.stdout + ended.stderr
    [(status, reason)] = query(db, "SELECT status, reason FROM runs")
    assert status == "failed" and "diverged" in reason and "lower learning rate" in reason
    # every worker that diverged says so; the first one's words are the run's reason
    [(count,)] = query(db, "SELECT count(*) FROM events WHERE kind = 'diverged'")
    assert count >= 1


def test_a_checkpoint_the_server_refuses_is_the_resumed_runs_reason(tmp_path: Path) -> None:
    import glob

    import numpy as np

    from tests.integration.support import launch_in_background, wait_for

    db = tmp_path / "experiments.db"
    launch = launch_in_background(db, "--checkpoint-every", "1")
    try:
        wait_for(lambda: db.exists() and query(
            db, "SELECT count(*) FROM events WHERE kind = 'checkpoint'")[0][0] >= 1, 120,
            "a checkpoint")
    finally:
        launch.kill()  # its roles die with it
        launch.communicate(timeout=30)
    [(run_id,)] = query(db, "SELECT id FROM runs")
    for path in glob.glob(str(tmp_path / "psctl-logs" / run_id / "checkpoints" / "*" / "*.npz")):
        arrays = dict(np.load(path, allow_pickle=False))
        arrays["params"][:3] = np.nan  # headers intact: psctl resume cannot tell
        np.savez(path, **arrays)
    resumed = subprocess.run(
        [sys.executable, "-m", "psctl", "resume", run_id[:8], "--db", str(db), "--no-live"],
        capture_output=True, text=True, cwd=tmp_path, timeout=150,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="300"))
    assert resumed.returncode != 0
    [(status, reason)] = query(db, "SELECT status, reason FROM runs")
    # It had crashed (its launcher killed), recording no end: the resume's is its end.
    assert status == "failed"
    assert reason.startswith("server 0 failed: checkpoint ")
    assert reason.endswith("holds values that are not finite float32")


def _poison_checkpoints(tmp_path: Path, run_id: str) -> None:
    import glob

    import numpy as np

    for path in glob.glob(str(tmp_path / "psctl-logs" / run_id / "checkpoints" / "*" / "*.npz")):
        arrays = dict(np.load(path, allow_pickle=False))
        arrays["params"][:3] = np.nan  # headers intact: psctl resume cannot tell
        np.savez(path, **arrays)


def test_a_resume_that_fails_before_training_leaves_an_interrupted_run_interrupted(
        tmp_path: Path) -> None:
    """Issue 57: the server's check of the checkpoint failed the resume, and the run, which had
    been interrupted, was relabelled failed. The resume's failure is its own (an event, the
    command's exit code and words); the run keeps the end it had."""
    import signal

    from tests.integration.support import launch_in_background, wait_until_training

    db = tmp_path / "experiments.db"
    launch = launch_in_background(db)
    try:
        wait_until_training(db)
    finally:
        launch.send_signal(signal.SIGINT)
        launch.communicate(timeout=60)
    [(run_id, status, reason)] = query(db, "SELECT id, status, reason FROM runs")
    assert (status, reason) == ("interrupted", "interrupted by the user")
    _poison_checkpoints(tmp_path, run_id)
    resumed = subprocess.run(
        [sys.executable, "-m", "psctl", "resume", run_id[:8], "--db", str(db), "--no-live"],
        capture_output=True, text=True, cwd=tmp_path, timeout=150,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="300"))
    assert resumed.returncode == 1, resumed.stderr
    assert query(db, "SELECT status, reason FROM runs") == [
        ("interrupted", "interrupted by the user")]
    [(detail,)] = query(db, "SELECT detail FROM events WHERE kind = 'resume_failed'")
    assert '"kept": "interrupted"' in detail and "holds values that are not finite" in detail
    said = " ".join(resumed.stderr.split())
    assert f"failed resume of run {run_id}" in said and "the run stays interrupted" in said
    assert "reason: server 0 failed: checkpoint " in said


def test_a_sparse_run_past_its_servers_memory_fails_at_once_saying_so(tmp_path: Path) -> None:
    """Issue 57: a sparse shard stored up to 2^28 keys whatever the machine held (12.6-19 GB a
    server). Past cluster.server_memory the push is refused, and the run ends with the
    server's words, not a worker's later, out-of-order push."""
    db = tmp_path / "experiments.db"
    ended = subprocess.run(
        [sys.executable, "-m", "psctl", "launch", "--dataset",
         "sparse-synthetic:features=2^40,nnz=40,samples=40000,test=1000,seed=1",
         "--model", "logreg", "--workers", "2", "--servers", "2", "--epochs", "1", "--no-live",
         "--db", str(db)],
        capture_output=True, text=True, cwd=tmp_path, timeout=150,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="300",
                 PSCTL_CLUSTER__SERVER_MEMORY=str(16 * 2**20)))
    assert ended.returncode == 1, ended.stderr
    [(status, reason)] = query(db, "SELECT status, reason FROM runs")
    assert status == "failed"
    assert re.fullmatch(r"server [01] failed: this server's sparse key ranges store [\d,]+ keys "
                        r"in [\d.]+ MiB and may take 16\.0 MiB \(cluster\.server_memory\): "
                        r"[\d,]+ keys more \([\d.]+ KiB\) do not fit; give the run more "
                        r"servers \(--servers\) or more cluster\.server_memory", reason), reason
    assert reason in " ".join(ended.stderr.split())
    stored = [json.loads(d)["stored_bytes"] for (d,) in query(
        db, "SELECT detail FROM events WHERE kind = 'server_stats'")]
    assert stored and max(stored) <= 16 * 2**20


def test_a_data_set_whose_load_raises_is_the_runs_reason(tmp_path: Path) -> None:
    """The coordinator loads a user's data first; the error it raised is the run's recorded
    reason, so that ``runs show`` and the run page say it, not only the coordinator's log."""
    (tmp_path / "broken.py").write_text(
        "def load():\n    raise ValueError('the CSV has 3 columns, expected 65')\n")
    db = tmp_path / "experiments.db"
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200")
    ended = subprocess.run(
        [sys.executable, "-m", "psctl", "launch", "--dataset", "broken.py:load", "--workers",
         "2", "--servers", "1", "--epochs", "1", "--no-live", "--db", str(db)],
        capture_output=True, text=True, cwd=tmp_path, timeout=150, env=env)
    assert ended.returncode != 0
    [(status, reason)] = query(db, "SELECT status, reason FROM runs")
    assert status == "failed"
    assert "load() raised ValueError: the CSV has 3 columns, expected 65" in reason, reason
    shown = subprocess.run([sys.executable, "-m", "psctl", "runs", "show", "@last", "--db",
                            str(db)], capture_output=True, text=True, cwd=tmp_path,
                           timeout=60, env=env)
    assert "reason: " in shown.stdout and "the CSV has 3 columns" in shown.stdout
