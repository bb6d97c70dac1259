"""``psctl resume RUN``: continue a failed, interrupted or crashed run from its newest complete
checkpoint, under the same run id, its iterations and series going on."""

from __future__ import annotations

import json
from pathlib import Path

from engine.backends import BACKENDS, THIS_MACHINE
from engine.config import RunConfig, upgraded
from engine.db.queries import CRASH_AFTER_S, effective_status
from engine.errors import LaunchError, StoreError
from engine.launcher import Launcher, ResumePoint
from engine.plan import parse_config
from engine.server.checkpoint import check_clocks, declared, shard_file
from engine.stopping import run_processes
from psctl.runstate import run_and_event

RESUMABLE = ("failed", "interrupted", "crashed")
# A job's worker slots: cluster.workers (at most 256) plus those psctl scale added; far more
# is a damaged header.
MAX_WORKER_SLOTS = 65_536


def plan_resume(db: Path, selector: str) -> tuple[RunConfig, ResumePoint]:
    """The run's stored config and where it continues from, or a LaunchError saying why it
    cannot be resumed."""
    run_id, row, detail = run_and_event(db, selector, "checkpoint")
    status = effective_status(row.status, row.heartbeat_at, _now(), CRASH_AFTER_S)
    if status == "running" and not run_processes(db, run_id):
        status = "crashed"  # its processes are gone; the heartbeat has not gone stale yet
    if status not in RESUMABLE:
        raise LaunchError(f"run {run_id[:8]} ({row.name}) is {status}; only a "
                          f"{', '.join(RESUMABLE[:-1])} or {RESUMABLE[-1]} run can be resumed")
    if detail is None:
        raise LaunchError(f"run {run_id[:8]} ({row.name}) has no complete checkpoint to resume "
                          "from; launch runs with --checkpoint-every SECONDS to have them")
    folder = Path(str(detail["folder"]))
    # A run recorded before settings moved (engine.config.MOVED) resumes as it ran.
    config = parse_config(upgraded(json.loads(row.config_json)))
    missing = [str(shard_file(folder, r)) for r in range(config.cluster.ranges)
               if not shard_file(folder, r).is_file()]
    if missing:
        raise LaunchError(f"checkpoint {detail['seq']} of run {run_id[:8]} is incomplete on "
                          f"disk: {', '.join(missing)} missing (deleted?)")
    _check_workers(folder, config.cluster.workers, config.cluster.ranges, run_id)
    return config, ResumePoint(run_id, row.name, folder.parent.parent, folder,
                               int(detail["seq"]))


def _check_workers(folder: Path, workers: int, shards: int, run_id: str) -> None:
    """The shards were saved with the run's workers (a job scaled with psctl scale was not)."""
    for index in range(shards):
        path = shard_file(folder, index)
        try:
            # Headers only: an array is read by the server that restores it, checked first.
            shape, _ = declared(path)["next"]
        except StoreError as exc:
            raise LaunchError(str(exc)) from None
        except KeyError:
            raise LaunchError(f"cannot read checkpoint {path}: it has no clocks (next); it is "
                              "not a psctl checkpoint") from None
        if len(shape) != 2:
            raise LaunchError(f"cannot read checkpoint {path}: its clocks (next) have shape "
                              f"{shape}, not workers x clock ranges")
        rows = shape[0]
        if rows > MAX_WORKER_SLOTS:
            raise LaunchError(f"cannot read checkpoint {path}: its clocks declare {rows} "
                              "workers (damaged or not a psctl checkpoint)")
        if rows != workers:
            raise LaunchError(f"run {run_id[:8]} had {rows} worker slots when checkpoint "
                              f"{folder.name} was saved, not the {workers} of its config (its "
                              "workers changed with psctl scale): it cannot be resumed")
        try:
            check_clocks(path, shape)
        except StoreError as exc:
            raise LaunchError(str(exc)) from None


def with_data_dir(config: RunConfig, data_dir: Path | None) -> RunConfig:
    """``config`` reading its data set from ``data_dir`` (``psctl resume --data-dir``, for
    files that moved since the run started), located and pinned as ``psctl launch`` does."""
    from engine.datasets import locate
    from engine.datasets.sources import is_user_source

    if data_dir is None or is_user_source(config.data.dataset):
        return config
    source = locate(config.data.dataset, data_dir, allow_download=True)
    if source in ("sklearn", "generated"):
        return config
    data = config.data.model_copy(update={"data_dir": str(Path(source).resolve())})
    return config.model_copy(update={"data": data})


def resumed_launcher(config: RunConfig, db: Path, point: ResumePoint) -> Launcher:
    if not BACKENDS.can(config.cluster.backend, THIS_MACHINE):
        raise LaunchError(f"psctl resume runs on the local backend; run {point.run_id[:8]} "
                          f"ran on {config.cluster.backend}")
    return Launcher(config, db=db, resume=point)


def _now() -> float:
    import time

    return time.time()
