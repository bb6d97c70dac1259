"""What a model of sparse samples (``--model logreg`` or ``embedding`` on a sparse data set) gives
the roles: its keys, the keys a batch needs and their gradient (the worker's sparse loop,
engine.worker.sparse), and what the evaluator pulls and reports. numpy only; each model
implements it in its own module, registered in engine.models.kinds (``BuiltinModel.sparse``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from engine.datasets.sparse import SparseSplit
from engine.errors import ConfigError
from engine.keys import KeyLayout
from engine.models.kinds import MODELS, SPARSE_ROWS

if TYPE_CHECKING:
    from engine.config import ModelConfig


@dataclass(frozen=True)
class Measured:
    """An evaluation: the loss the run reports (each model says which), the test accuracy, more
    numbers recorded as the evaluator's metrics (``auc``: charted, exported), and facts for the
    ``sparse_model`` event (``nonzero``: weights not exactly 0)."""

    loss: float
    accuracy: float
    metrics: dict[str, float] = field(default_factory=dict)
    facts: dict[str, int] = field(default_factory=dict)


class RowsEvaluation(Protocol):
    keys: np.ndarray  # sorted: the keys the evaluator pulls, every time

    def measure(self, values: np.ndarray) -> Measured:
        """The evaluation, from the values of ``keys``."""
        ...


class RowsModel(Protocol):
    features: int

    def layout(self) -> KeyLayout:
        """The model's keys; what the coordinator lays out and each role checks."""
        ...

    def initial_values(self) -> np.ndarray | None:
        """What worker 0 sends the servers to start from; None when the servers start every
        key themselves (sparse keys, or rules: engine.initial)."""
        ...

    def working_set(self, rows: SparseSplit) -> np.ndarray:
        """The sorted keys a batch of ``rows`` pulls and pushes."""
        ...

    def gradient(self, rows: SparseSplit, keys: np.ndarray,
                 values: np.ndarray) -> tuple[float, np.ndarray]:
        """(mean loss of ``rows``, its gradient on ``keys``) from the values of ``keys``."""
        ...

    def evaluation(self, train: SparseSplit, test: SparseSplit, l1: float) -> RowsEvaluation:
        """What the evaluator pulls and computes, over the data set's splits."""
        ...


def rows_model(model: ModelConfig, features: int) -> RowsModel:
    """The registered model the run's ``model`` section names, for sparse samples of
    ``features`` features (built with the section's widths and the model's own settings)."""
    entry = MODELS.get(model.name) if model.name in MODELS else None
    if entry is None or entry.sparse is None:
        raise ConfigError(f"sparse data sets train --model "
                          f"{' or '.join(MODELS.able(SPARSE_ROWS))}, not {model.name}")
    built: RowsModel = entry.sparse.load()(features, model)
    return built
