"""psctl resume's plan: which runs it refuses, and why, before any process starts."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.config import RunConfig
from engine.errors import LaunchError
from engine.keys import KeyRange
from engine.plan import build_config
from engine.recorder import Recorder
from engine.roles.coordinator import model_layout
from engine.roles.server import build_shard
from engine.server.checkpoint import save
from engine.wire.records import EventRecord, RunStatus
from psctl.cli import app
from psctl.resume import plan_resume, with_data_dir


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


# -- damaged checkpoints (issue 37): one line naming the file, never numpy's advice -------------


def _damage(folder: Path, how: str) -> Path:
    from tests.engine.server.test_checkpoint import forged

    path = folder / "shard-0.npz"
    if how == "empty":
        path.write_bytes(b"")
    elif how == "random":  # issue 57: it was said to hold Python objects
        path.write_bytes(bytes(range(7, 256)) * 16)
    elif how == "pickled":
        np.savez(path, next=np.array([{"evil": 1}], dtype=object))
    elif how == "huge-header":
        forged(path, "next", (2**40, 2)).replace(path)
    elif how == "no-clocks":
        np.savez(path, params=np.zeros(2, dtype=np.float32))
    return path


@pytest.mark.parametrize(("how", "problem"), [
    ("empty", "No data left in file (damaged or not a checkpoint)"),
    ("pickled", "it holds Python objects, which psctl never loads"),
    ("random", "it is neither an archive of arrays (.npz) nor an array (damaged or not a "
               "checkpoint)"),
    ("huge-header", "its clocks declare 1099511627776 workers (damaged or not a psctl "
                    "checkpoint)"),
    ("no-clocks", "it has no clocks (next); it is not a psctl checkpoint"),
])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(db: Path, tmp_path: Path, how: str,
                                                          problem: str) -> None:
    folder = tmp_path / "psctl-logs" / "run" / "checkpoints" / "000003"
    _save_shards(folder, workers=2)
    path = _damage(folder, how)
    _record(db, "f" * 32, RunStatus.FAILED, folder)
    done = CliRunner().invoke(app, ["resume", "f" * 8, "--db", str(db), "--no-live"])
    assert done.exit_code == 1, done.output
    (line,) = done.stderr.strip().splitlines()
    assert problem in line, line
    assert f"cannot read checkpoint {path}: " in line, line
    assert "allow_pickle" not in done.output and "Aborted" not in done.output
    assert "Traceback" not in done.output


def test_data_dir_reaches_the_loader_for_a_file_data_set(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    import engine.datasets

    asked: list[tuple[str, Path | None]] = []

    def locate(name: str, data_dir: Path | None = None, *, allow_download: bool = False) -> str:
        asked.append((name, data_dir))
        return str(tmp_path / "mnist")

    monkeypatch.setattr(engine.datasets, "locate", locate)
    config = build_config({}, {"data.dataset": "mnist", "data.data_dir": "/old/place"})
    moved = with_data_dir(config, tmp_path)
    assert asked == [("mnist", tmp_path)]
    assert moved.data.data_dir == str((tmp_path / "mnist").resolve())
    assert with_data_dir(config, None) is config


def test_clocks_a_server_would_refuse_are_refused_before_any_process(db: Path,
                                                                     tmp_path: Path) -> None:
    folder = tmp_path / "psctl-logs" / "run" / "checkpoints" / "000003"
    _save_shards(folder, workers=2)
    path = folder / "shard-1.npz"
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["next"][1, 0] = 10**9  # replaying it would spin the server for minutes
    np.savez(path, **arrays)
    _record(db, "9" * 32, RunStatus.FAILED, folder)
    with pytest.raises(LaunchError) as caught:
        plan_resume(db, "9" * 8)
    assert str(caught.value) == (f"checkpoint {path} holds clock 1000000000, more than the "
                                 f"{int(arrays['pushes'][0])} pushes it records (damaged or not "
                                 "a checkpoint of this run)")
