"""The coordinator role: owns the recorder (the database's only writer) and the run's end."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from engine.config import RunConfig
from engine.datasets import get_spec
from engine.models.spec import MLPSpec
from engine.recorder import Recorder
from engine.roles.coordination import Coordinator
from engine.transport.base import Transport
from engine.wire.records import EventRecord, RunStatus

EXIT_CODES = {RunStatus.FINISHED: 0, RunStatus.FAILED: 1, RunStatus.INTERRUPTED: 130}


def model_spec(config: RunConfig) -> MLPSpec:
    dataset = get_spec(config.data.dataset)
    return MLPSpec(dataset.input_dim, config.model.hidden, dataset.num_classes)


async def coordinate(config: RunConfig, *, run_id: str, name: str, token: str, db: Path,
                     transport: Transport, host: str, port: int,
                     announce: Callable[[str], None]) -> RunStatus:
    """Record a run from its first connection to its end; returns its final status."""
    recorder = Recorder(db)
    recorder.start_run(run_id, name, config.to_json_dict(), sync=config.sync.model,
                       workers=config.cluster.workers, servers=config.cluster.servers,
                       dataset=config.data.dataset)
    status: RunStatus = RunStatus.FAILED
    reason: str | None = "coordinator stopped before the run ended"
    try:
        coordinator = Coordinator(config, run_id=run_id, token=token, recorder=recorder,
                                  layout=model_spec(config).layout())
        _on_signals(coordinator.interrupt)
        address = await coordinator.start(transport, host, port)
        recorder.record_event(EventRecord(at=time.time(), kind="coordinator_listening",
                                          detail={"address": address}))
        announce(address)
        status, reason = await coordinator.run()
    finally:
        await asyncio.to_thread(recorder.finish, status, reason)
        recorder.close()
    return status


def _on_signals(handler: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError):  # not the main thread (in-process tests)
            return


def announce_on_stdout(address: str) -> None:
    """The launcher reads this line to learn where the coordinator listens."""
    sys.stdout.write(f"PSCTL_COORDINATOR {address}\n")
    sys.stdout.flush()
