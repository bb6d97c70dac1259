"""The coordinator role: owns the recorder (the database's only writer) and the run's end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from engine.config import RunConfig
from engine.datasets import describe
from engine.datasets.sources import label
from engine.db import open_engine
from engine.db.queries import reading, resume_clock
from engine.errors import PsctlError, StoreError
from engine.keys import KeyLayout
from engine.models.spec import builtin_layout
from engine.proctime import usable_cores
from engine.recorder import Recorder
from engine.roles.coordination import Coordinator, Resume
from engine.roles.lifecycle import started, this_machine
from engine.roles.resuming import EarlierEnd, earlier_end, end_to_record
from engine.roles.sampling import PsutilSampler, oversubscription
from engine.transport.base import Transport
from engine.wire.messages import RunEnded
from engine.wire.records import EventRecord, RunStatus

EXIT_CODES = {RunStatus.FINISHED: 0, RunStatus.FAILED: 1, RunStatus.INTERRUPTED: 130}
# How often the recorder is asked whether its writer failed: a run that records nothing for a
# while (all workers waiting) must still end within seconds of losing its database row.
RECORDER_CHECK_S = 0.5
log = logging.getLogger(__name__)


def model_layout(config: RunConfig) -> KeyLayout:
    """The key layout of the run's model: arithmetic for a built-in one, read from the module a
    user's file builds otherwise (the one place the coordinator imports torch)."""
    data_dir = Path(config.data.data_dir) if config.data.data_dir else None
    data = describe(config.data.dataset, data_dir, train_limit=config.data.train_limit,
                    hash_features=config.data.hash_features)
    layout = builtin_layout(config.model, data.sample_shape, data.num_classes,
                            sparse=data.sparse)
    if layout is None:
        from engine.models.build import build_module, layout_of

        layout = layout_of(build_module(config.model.name, config.model.hidden,
                                        data.sample_shape, data.num_classes,
                                        seed=config.train.seed))
    return layout


async def coordinate(config: RunConfig, *, run_id: str, name: str, token: str, db: Path,
                     transport: Transport, host: str, port: int,
                     announce: Callable[[str], None], folder: Path | None = None,
                     resume: Resume | None = None) -> RunStatus:
    """Record a run from its first connection to its end; returns its final status. With
    ``resume`` the run is an ended one continued from a checkpoint."""
    recorder = Recorder(db)
    active_s = downtime_s = epoch = 0.0
    earlier: EarlierEnd | None = None  # a resumed run's end before this resume
    if resume is None:
        recorder.start_run(run_id, name, config.to_json_dict(), sync=config.sync.model,
                           workers=config.cluster.workers, servers=config.cluster.servers,
                           dataset=label(config.data.dataset))
    else:
        active_s, downtime_s, epoch = _resume_clock(db, run_id)
        earlier = earlier_end(db, run_id)
        recorder.resume_run(run_id)
        recorder.record_event(EventRecord(at=time.time(), kind="resumed", detail={
            "checkpoint": resume.seq, "folder": str(resume.folder),
            "downtime_s": round(downtime_s, 3), "active_s": round(active_s, 3)}))
    status: RunStatus = RunStatus.FAILED
    reason: str | None = "coordinator stopped before the run ended"
    watcher: asyncio.Task[None] | None = None
    coordinator: Coordinator | None = None
    try:
        sampler = PsutilSampler()
        sampler.watch("coordinator", 0, os.getpid())
        coordinator = Coordinator(config, run_id=run_id, token=token, recorder=recorder,
                                  layout=model_layout(config), sampler=sampler,
                                  folder=folder, resume=resume)
        if resume is not None:  # one clock: evaluation times and epochs go on, not back
            coordinator.started_at = time.time() - active_s
            coordinator.progress.epoch_floor = epoch
        _on_signals(coordinator.interrupt)
        address = await coordinator.start(transport, host, port)
        # The pid lets `psctl runs rm --force` stop this run before deleting it.
        began, forked = started()  # its own start-up, as each role's join says its own
        recorder.record_event(EventRecord(at=time.time(), kind="coordinator_listening", detail={
            "address": address, "pid": os.getpid(), "machine": this_machine(),
            "folder": None if folder is None else str(folder),
            "start_s": round(max(time.time() - began, 0.0), 3), "forked": forked}))
        # Across a Ray cluster the roles share other machines' cores, not this one's.
        crowded = (oversubscription(config.cluster.workers, config.cluster.servers,
                                    usable_cores())
                   if config.cluster.backend == "local" else None)
        if crowded is not None:  # stored, so that the run's views can say so afterwards
            recorder.record_event(EventRecord(at=time.time(), kind="oversubscribed",
                                              detail={"cores": usable_cores(),
                                                      "message": crowded}))
        watcher = asyncio.create_task(_watch_recorder(recorder, coordinator))
        announce(address)
        status, reason = await coordinator.run()
    except PsctlError as exc:  # e.g. the run's data failed to load: the run's reason, in words
        reason = str(exc)
        raise
    except Exception as exc:  # its log has the traceback; the run says what it was
        reason = f"the coordinator failed: {type(exc).__name__}: {exc}"
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
        trained = coordinator is not None and coordinator.training.is_set()
        status, reason, recorded = await asyncio.to_thread(
            _record_end_of, recorder, db, run_id, (status, reason),
            end_to_record(earlier, trained, status, reason))
        if coordinator is not None:  # the launcher is told; it reads the database otherwise
            await coordinator.close(RunEnded(status=status.value, reason=reason,
                                             recorded=recorded))
        recorder.close()
    return status


def _resume_clock(db: Path, run_id: str) -> tuple[float, float, float]:
    """(active seconds so far, seconds down until now, highest evaluated epoch) of the run
    being resumed."""
    engine = open_engine(db, readonly=True)
    try:
        with reading(engine, "reading the run to resume") as conn:
            return resume_clock(conn, run_id, time.time())
    finally:
        engine.dispose()


async def _watch_recorder(recorder: Recorder, coordinator: Coordinator) -> None:
    while True:
        await asyncio.sleep(RECORDER_CHECK_S)
        try:
            recorder.check()
        except StoreError as exc:
            coordinator.recorder_failed(exc)
            return


def _record_end_of(recorder: Recorder, db: Path, run_id: str,
                   ended: tuple[RunStatus, str | None],
                   recorded: tuple[RunStatus, str | None]) -> tuple[RunStatus, str | None, bool]:
    """Record ``recorded`` as the run's end: how it ``ended``, or the end a resumed run had
    before a resume that failed before it trained again (which is then an event). Returns how
    it ended (failed, if that could not be recorded) and whether the database holds it."""
    if recorded != ended:
        with contextlib.suppress(StoreError):  # its end is what matters, and says so
            recorder.record_event(EventRecord(at=time.time(), kind="resume_failed", detail={
                "reason": ended[1], "kept": recorded[0].value}))
    status, reason, written = _record_end(recorder, db, run_id, *recorded)
    return (status, reason, written) if (status, reason) != recorded else (*ended, written)


def _record_end(recorder: Recorder, db: Path, run_id: str, status: RunStatus,
                reason: str | None) -> tuple[RunStatus, str | None, bool]:
    """Record the run's end; a run whose end cannot be recorded failed, and that is written
    through a fresh connection if the database still takes it (a run row that is gone does not).
    The last line on stderr says why, for the launcher to report when the database cannot.
    Returns the status and reason, and whether the database holds them."""
    try:
        recorder.finish(status, reason)
        return status, reason, True
    except StoreError as exc:
        if status is not RunStatus.FAILED:
            reason = f"its end ({status.value}) could not be recorded: {exc}"
    recorded = False
    try:
        recorded = Recorder.mark_ended(db, run_id, RunStatus.FAILED, reason)
    except StoreError as exc:
        log.error("could not mark run %s failed either: %s", run_id, exc)
    print(f"psctl coordinator: run {run_id} failed: {reason}", file=sys.stderr, flush=True)
    return RunStatus.FAILED, reason, recorded


def _on_signals(handler: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError):  # not the main thread (in-process tests)
            return


def announce_on_stdout(address: str) -> None:
    """The launcher reads this line to learn where the coordinator listens."""
    sys.stdout.write(_announcement(address))
    sys.stdout.flush()


def announce_in_file(path: Path) -> Callable[[str], None]:
    """The same line, written whole into ``path`` (a coordinator forked from the warm template
    writes its stdout to its log): written beside it and renamed, so a reader never sees half."""
    def announce(address: str) -> None:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(_announcement(address))
        partial.replace(path)

    return announce


def _announcement(address: str) -> str:
    return f"PSCTL_COORDINATOR {address}\n"
