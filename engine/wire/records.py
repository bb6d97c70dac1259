"""What the processes of a run report, validated at the coordinator and written by the recorder.

These are the only shapes that travel from workers and the evaluator to the database. They are
pydantic models so that a report arriving over the network is checked field by field before it
can reach SQLite.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.usermetrics import NAME_PATTERN


class RunStatus(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    # Never written by the recorder: readers derive it from a stale heartbeat on a running run.
    CRASHED = "crashed"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class IterationRecord(_Record):
    """One worker iteration. compute_s + push_s + pull_s + wait_s accounts for its wall time.

    Each duration is the time the worker's training loop was *blocked* in that phase, so
    communication that overlaps computation is not counted twice.
    """

    worker: int = Field(ge=0)
    iteration: int = Field(ge=0)
    epoch: int = Field(ge=0)
    started_at: float
    ended_at: float
    compute_s: float = Field(ge=0)
    push_s: float = Field(ge=0)
    pull_s: float = Field(ge=0)
    wait_s: float = Field(ge=0)
    staleness: int = Field(ge=0)
    loss: float | None
    samples: int = Field(ge=0)
    bytes_sent: int = Field(ge=0)
    bytes_received: int = Field(ge=0)
    pushed_at: float | None = None
    acked_at: float | None = None
    # The multiplier the servers applied this iteration's gradient with (aggregator weight x
    # schedule x staleness rule), key-weighted over shards; None when nothing was pushed.
    lr_scale: float | None = Field(None, ge=0, allow_inf_nan=False)
    # The push frames' bytes (part of bytes_sent), and what they would have been as dense
    # float32 frames: their ratio is what the push filter saved.
    push_bytes: int = Field(0, ge=0)
    push_bytes_dense: int = Field(0, ge=0)
    # The bytes a read answered from the worker's cache (SSP) did not move: the fetch's.
    pull_bytes_saved: int = Field(0, ge=0)

    @field_validator("loss")
    @classmethod
    def _finite_loss(cls, value: float | None) -> float | None:
        # NaN cannot be stored faithfully in JSON or compared in SQL; a diverged loss is None.
        return value if value is None or math.isfinite(value) else None


class LayerRecord(_Record):
    """One layer's pull and push in one iteration of the scheduled worker loop: where each
    request stood in its schedule, how long the servers held the pull back (suspend time) and
    the push's staleness (updates to the layer between its pull and its push)."""

    worker: int = Field(ge=0)
    iteration: int = Field(ge=0)
    layer: int = Field(ge=0)
    pull_order: int = Field(ge=0)
    push_order: int = Field(ge=0)
    suspend_s: float = Field(ge=0, allow_inf_nan=False)
    staleness: int = Field(ge=0)


class UserMetricRecord(_Record):
    """A metric the user's own code logged (``psctl.log``): the mean of the values it logged
    under ``name`` during one iteration of a worker, or one evaluation of the evaluator (whose
    ``iteration`` is the evaluation's step: the server updates applied)."""

    role: Literal["worker", "evaluator"]
    rank: int = Field(ge=0)
    iteration: int = Field(ge=0)
    at: float = Field(allow_inf_nan=False)
    name: str = Field(pattern=f"^{NAME_PATTERN}$")
    value: float = Field(allow_inf_nan=False)


class EvaluationRecord(_Record):
    """Test-set accuracy and loss of the model held by the servers at one moment."""

    # A diverged model's test loss travels as "NaN" or "Infinity" (JSON has no such numbers),
    # so that the coordinator sees the divergence and ends the run saying so.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    at: float
    elapsed_s: float = Field(ge=0)
    step: int = Field(ge=0)
    accuracy: float = Field(ge=0, le=1)
    loss: float
    epoch: float = Field(ge=0)


def divergence(row: EvaluationRecord) -> str | None:
    """Why the run must stop if this evaluation shows a diverged model (a test loss that is not
    finite: the database keeps no such value), else None."""
    if math.isfinite(row.loss):
        return None
    return (f"the model diverged: the test loss is {row.loss} at step {row.step} (accuracy "
            f"{row.accuracy:.2%}); try a lower learning rate or less staleness")


class EventRecord(_Record):
    """Something that happened: a process started or exited, an error, a barrier."""

    at: float
    kind: str = Field(min_length=1, max_length=64)
    detail: dict[str, Any] = Field(default_factory=dict)


class SyncRecord(_Record):
    """One ElasticBSP barrier: the decision (predicted end times, chosen iterations, predicted
    wait) and, once every worker has reached it, the arrivals and the wait actually observed."""

    sync_index: int = Field(ge=0)
    decided_at: float
    predictor: str = Field(min_length=1, max_length=32)
    lookahead: int = Field(ge=1)
    base_clocks: list[int]
    predicted: list[list[float]]
    chosen: list[int]
    barrier_clocks: list[int]
    predicted_wait: float = Field(ge=0)
    arrivals: list[float] | None = None
    actual_wait: float | None = Field(None, ge=0)
    released_at: float | None = None


class ProcessSample(_Record):
    """One process of the run, sampled: its share of a core and its resident memory."""

    at: float
    role: str = Field(min_length=1, max_length=16)
    rank: int = Field(ge=0)
    pid: int = Field(ge=1)
    cpu_percent: float = Field(ge=0)  # of one core: a process busy on two cores reads 200
    rss_bytes: int = Field(ge=0)
    # Proportional set size: each shared page split among the processes that map it, so PSS
    # sums over processes where RSS does not. Read in turn within a budget (engine/roles/
    # sampling.py), so None in most samples of a large run; also None where it cannot be read.
    pss_bytes: int | None = Field(None, ge=0)
