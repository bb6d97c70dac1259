"""psctl resume's plan: which runs it refuses, and why, before any process starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.config import RunConfig, build_config
from engine.errors import LaunchError
from engine.keys import KeyRange
from engine.recorder import Recorder
from engine.roles.coordinator import model_layout
from engine.roles.server import build_shard
from engine.server.checkpoint import save
from engine.wire.records import EventRecord, RunStatus
from psctl.resume import plan_resume


def _config(workers: int = 2) -> RunConfig:
    return build_config({}, {"data.dataset": "digits", "cluster.workers": workers,
                             "cluster.servers": 2, "model.hidden": (8,)})


def _record(db: Path, run_id: str, status: RunStatus, folder: Path | None) -> None:
    recorder = Recorder(db)
    config = _config()
    recorder.start_run(run_id, run_id, config.to_json_dict(), sync="bsp", workers=2, servers=2,
                       dataset="digits")
    if folder is not None:
        recorder.record_event(EventRecord(at=time.time(), kind="checkpoint",
                                          detail={"seq": 3, "folder": str(folder)}))
    recorder.finish(status, "stopped")
    recorder.close()


def _save_shards(folder: Path, workers: int) -> None:
    config = _config(workers)
    layout = model_layout(config)
    half = layout.num_keys // 2
    for index, keys in enumerate((KeyRange(0, half), KeyRange(half, layout.num_keys))):
        state = build_shard(config, keys, layout)
        state.initialized = True
        save(state, folder, index, 3)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "experiments.db"


def test_a_failed_run_is_planned_from_its_newest_checkpoint(db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "psctl-logs" / "run" / "checkpoints" / "000003"
    _save_shards(folder, workers=2)
    _record(db, "a" * 32, RunStatus.FAILED, folder)
    config, point = plan_resume(db, "a" * 8)
    assert config.cluster.workers == 2
    assert (point.run_id, point.seq, point.checkpoint) == ("a" * 32, 3, folder)
    assert point.folder == folder.parent.parent


def test_a_finished_run_is_refused(db: Path, tmp_path: Path) -> None:
    _record(db, "b" * 32, RunStatus.FINISHED, tmp_path)
    with pytest.raises(LaunchError, match="is finished; only a failed, interrupted or crashed "
                                          "run can be resumed"):
        plan_resume(db, "b" * 8)


def test_a_run_without_a_checkpoint_is_refused(db: Path) -> None:
    _record(db, "c" * 32, RunStatus.INTERRUPTED, None)
    with pytest.raises(LaunchError, match="has no complete checkpoint to resume from; launch "
                                          "runs with --checkpoint-every SECONDS"):
        plan_resume(db, "c" * 8)


def test_a_checkpoint_whose_files_are_gone_is_refused(db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    _record(db, "d" * 32, RunStatus.FAILED, folder)
    with pytest.raises(LaunchError, match=r"checkpoint 3 of run d{8} is incomplete on disk: "
                                          r".*shard-0.npz, .*shard-1.npz missing"):
        plan_resume(db, "d" * 8)


def test_a_checkpoint_of_a_scaled_job_is_refused(db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "scaled"
    _save_shards(folder, workers=4)  # two workers joined before it was saved
    _record(db, "e" * 32, RunStatus.FAILED, folder)
    with pytest.raises(LaunchError, match="had 4 worker slots when checkpoint scaled was "
                                          "saved, not the 2 of its config"):
        plan_resume(db, "e" * 8)
