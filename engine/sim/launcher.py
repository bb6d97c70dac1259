"""``cluster.backend = "sim"``: the run in this process, on a thread of its own, in virtual time.

The thread owns the recorder (the database's one writer for this run); the caller's thread only
watches it, so Ctrl-C reaches the caller, which asks the simulation to stop after the current
steps, as a real run's workers do.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from engine.config import RunConfig
from engine.datasets.sources import label
from engine.errors import PsctlError
from engine.launcher import LaunchResult, NewRun
from engine.recorder import Recorder
from engine.sim.clock import run_virtual
from engine.sim.cluster import SimCluster
from engine.wire.records import RunStatus

# After Ctrl-C, how long the simulation may take to wind down before the wait gives up on it.
STOP_WAIT_S = 60.0


class SimLauncher(NewRun):
    def __init__(self, config: RunConfig, *, db: Path, logs_root: Path | None = None) -> None:
        super().__init__(config, db=db, logs_root=logs_root)
        self._interrupted = threading.Event()
        # Set when the simulation has recorded its end. Waited on instead of Thread.join: a
        # join interrupted by Ctrl-C can leave the thread looking dead while it still runs.
        self._ended = threading.Event()
        self._outcome: tuple[RunStatus, str | None] | None = None
        self._thread: threading.Thread | None = None
        self._recorder: Recorder | None = None

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        epoch = time.time()
        recorder = self._recorder = Recorder(self.db)
        cfg = self.config
        recorder.start_run(self.run_id, self.name, cfg.to_json_dict(), sync=cfg.sync.model,
                           workers=cfg.cluster.workers, servers=cfg.cluster.servers,
                           dataset=label(cfg.data.dataset), started_at=epoch)
        self._thread = threading.Thread(target=self._simulate, args=(recorder, epoch),
                                        name="psctl-sim", daemon=True)
        self._thread.start()

    def _simulate(self, recorder: Recorder, epoch: float) -> None:
        status, reason, ended = RunStatus.FAILED, "the simulation stopped unexpectedly", epoch
        try:
            cluster = SimCluster(self.config, recorder, epoch=epoch,
                                 interrupted=self._interrupted)
            status, reason, virtual_s = run_virtual(cluster.run())
            ended = epoch + virtual_s
        except PsctlError as exc:
            reason = str(exc)
        except Exception as exc:  # a bug: its traceback goes to the run's log
            (self.logs / "sim.log").write_text(traceback.format_exc())
            reason = f"simulation failed: {exc!r} (traceback in {self.logs / 'sim.log'})"
        finally:
            try:
                recorder.finish(status, reason, ended_at=max(ended, epoch))
            except PsctlError as exc:  # as the coordinator: the end goes in through a fresh
                status, reason = RunStatus.FAILED, f"its end could not be recorded: {exc}"
                with contextlib.suppress(PsctlError):  # connection if the database takes it
                    Recorder.mark_ended(self.db, self.run_id, status, reason)
            with contextlib.suppress(PsctlError):
                recorder.close()
            self._outcome = (status, reason)
            self._ended.set()

    def wait(self, on_tick: Callable[[], None] | None = None,
             tick_s: float = 0.5) -> LaunchResult:
        if self._thread is None:
            raise RuntimeError("wait() before start()")
        while not self._ended.is_set():
            try:
                self._ended.wait(tick_s)
                if on_tick is not None:
                    on_tick()
            except KeyboardInterrupt:
                self._interrupted.set()
                self._ended.wait(STOP_WAIT_S)
                break
        if on_tick is not None:
            on_tick()
        if self._outcome is None:  # still building (loading data, measuring) after the grace
            late = f"interrupted; the simulation did not stop within {STOP_WAIT_S:g} s"
            Recorder.mark_ended(self.db, self.run_id, RunStatus.INTERRUPTED, late)
            return LaunchResult(self.run_id, RunStatus.INTERRUPTED, late, self.logs, (), 0)
        status, reason = self._outcome
        return LaunchResult(self.run_id, status, reason, self.logs, (), 0)
