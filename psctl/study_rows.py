"""A study report's row: one run's figures, as the table, summary.json and the plots read them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    labels: dict[str, str]  # axis name -> value label
    seed: int | None
    run_id: str
    name: str
    status: str
    time_to_target_s: float | None
    final_accuracy: float | None
    best_accuracy: float | None
    iterations: int
    epochs: float | None  # of the last evaluation
    idle_fraction: float | None  # sum(wait_s) / sum(iteration wall) over every iteration
    staleness_mean: float | None
    bytes_per_sample: float | None
    duration_s: float
    # Until the workers together had run one epoch's iterations: the speed of a pass over the
    # data, which under asynchronous models a straggler's tail does not decide.
    epoch_time_s: float | None = None
    samples_per_s: float | None = None  # training samples over the training wall time
    # Under a budget in seconds: test accuracy at each mark ("25%" ... "100%"), the evaluation
    # nearest to it in seconds of training (the last one for the end).
    mark_accuracy: dict[str, float | None] = field(default_factory=dict)
    # (elapsed s, step, accuracy) of every evaluation, for the plots; not in summary.json
    evaluations: list[tuple[float, int, float]] = field(default_factory=list, repr=False)
