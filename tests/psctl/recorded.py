"""Runs written straight into a database by the recorder (no process launched): a few
workers with the numbers a long run has (thousands of iterations, millions of samples per
second), so that every column of the terminal's tables is wide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, EventRecord, IterationRecord, RunStatus

T0 = 1_700_000_000.0
# What the simulated cluster records with its runs (engine/sim/cluster.py).
SIMULATED = {"network": "10gbit:50us", "server_network": "10gbit:50us", "compute_ms": 5.0,
             "compute_measured": False, "update_ms": 32.0, "update_measured": True}


def recorded_run(db: Path, run_id: str, name: str, *, workers: int = 4,
                 simulated: bool = False, started_at: float = T0, **config: Any) -> str:
    """A finished run of ``workers`` workers with an lr scale, push bytes and a cache, whose
    config's sections are updated by ``config`` (``stop={"target_accuracy": 0.97}``)."""
    values = RunConfig().to_json_dict()
    for section, update in config.items():
        values[section] |= update
    recorder = Recorder(db)
    try:
        recorder.start_run(run_id, name, values, sync="elastic", workers=workers, servers=2,
                           dataset="fashion-mnist", started_at=started_at)
        recorder.record_iterations([_iteration(worker, i, started_at)
                                    for worker in range(workers) for i in range(3)])
        for i, accuracy in enumerate((0.4, 0.871234, 0.9712)):
            recorder.record_evaluation(EvaluationRecord(
                at=started_at + 3 + i, elapsed_s=3 + i, step=1234 * i, accuracy=accuracy,
                loss=1 - accuracy, epoch=i / 2))
        if simulated:
            recorder.record_event(EventRecord(at=started_at + 1, kind="simulated",
                                              detail=SIMULATED))
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    return run_id


def _iteration(worker: int, i: int, t0: float) -> IterationRecord:
    # Millisecond iterations of big batches: samples/s in the millions, KB in the thousands.
    return IterationRecord(
        worker=worker, iteration=i, epoch=0, started_at=t0 + 1 + i * 1e-3,
        ended_at=t0 + 1 + (i + 1) * 1e-3, compute_s=1.23456e-4, push_s=2.5e-4, pull_s=3.125e-4,
        wait_s=1.1e-4, staleness=12_345 * worker, loss=0.5, samples=4_096, bytes_sent=10_000,
        bytes_received=10_000, lr_scale=0.0625 * (worker + 1), push_bytes=1_234_567,
        push_bytes_dense=9_876_543, pull_bytes_saved=3_456_789)
