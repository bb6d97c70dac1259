"""Sparse binary logistic regression (seed 003's workload): the model a sparse run trains, its
gradient on a batch's working set, and the objective and accuracy the evaluator reports. numpy
and scipy only: the worker's sparse loop (engine.worker.sparse) and the evaluator share it.

Nothing here is as large as the feature space (issue 44: 2^40 features): a batch, and the
evaluator, work on matrices whose columns are the keys they pulled (``local_matrix``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from engine.datasets.sparse import SparseSplit
from engine.keys import KeyLayout, KeyRange, Segment
from engine.models.rows import Measured

if TYPE_CHECKING:
    from engine.config import ModelConfig


class SparseLogReg:
    """Binary logistic regression over ``features`` weights, one key each. It holds no copy of
    them: the servers store a sparse key range from 0 wherever nothing was pushed, and a batch
    pulls the keys it needs (``engine.worker.sparse``)."""

    def __init__(self, features: int) -> None:
        self.features = features

    def layout(self) -> KeyLayout:
        """One weight per feature, a sparse range starting at 0 (no rule: zeros)."""
        keys = KeyRange(0, self.features)
        return KeyLayout((Segment("weight", (self.features,), keys, sparse=True),))

    @staticmethod
    def working_set(rows: SparseSplit) -> np.ndarray:
        return working_set(rows)

    @staticmethod
    def evaluation(train: SparseSplit, test: SparseSplit, l1: float) -> LogRegEvaluation:
        return LogRegEvaluation(train, test, l1)

    @staticmethod
    def initial_values() -> np.ndarray | None:
        """What worker 0 sends the servers to start from: nothing, as every key starts at 0."""
        return None

    @staticmethod
    def gradient(rows: SparseSplit, keys: np.ndarray,
                 weights: np.ndarray) -> tuple[float, np.ndarray]:
        """(mean logistic loss, its gradient on ``keys``) for ``rows``, whose features all lie
        in ``keys`` (sorted), with ``weights`` the values of ``keys``."""
        from scipy.special import expit

        matrix = local_matrix(rows, keys)
        margins = matrix @ weights.astype(np.float64)
        loss = mean_loss(margins, rows.labels)
        grad = matrix.T @ ((expit(margins) - rows.labels) / len(rows))
        return loss, np.asarray(grad, dtype=np.float32)


def sparse_model(features: int, model: ModelConfig) -> SparseLogReg:
    """The model of a run of ``--model logreg`` on sparse samples (engine.models.kinds)."""
    return SparseLogReg(features)


class LogRegEvaluation:
    """The objective the run minimises over the training set (as the loss) and the test
    accuracy. Only the features the two splits have are pulled, never the whole feature space:
    a feature no training row has is never pushed and stays 0, so the objective over these keys
    is the whole model's."""

    def __init__(self, train: SparseSplit, test: SparseSplit, l1: float) -> None:
        self.keys = np.union1d(working_set(train), working_set(test))
        self.train, self.test = local_matrix(train, self.keys), local_matrix(test, self.keys)
        self.labels = train.labels, test.labels
        self.l1 = l1

    def measure(self, values: np.ndarray) -> Measured:
        return Measured(loss=compact_objective(self.train, self.labels[0], values, self.l1),
                        accuracy=compact_accuracy(self.test, self.labels[1], values),
                        facts={"nonzero": int(np.count_nonzero(values))})


def local_matrix(rows: SparseSplit, keys: np.ndarray) -> Any:
    """``rows`` as a CSR matrix whose column j is feature ``keys[j]`` (``keys`` sorted, holding
    every feature of ``rows``): as wide as the keys, not the feature space."""
    from scipy.sparse import csr_matrix

    local = np.searchsorted(keys, rows.indices)
    return csr_matrix((rows.values, local, rows.indptr), shape=(len(rows), len(keys)))


def mean_loss(margins: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.logaddexp(0.0, margins) - labels * margins))


def objective(weights: np.ndarray, rows: SparseSplit, l1: float) -> float:
    """Mean logistic loss over ``rows`` plus l1 * |w|_1: what the run minimises (``weights``
    dense, one per feature)."""
    return compact_objective(rows.matrix(len(weights)), rows.labels, weights, l1)


def accuracy(weights: np.ndarray, rows: SparseSplit) -> float:
    return compact_accuracy(rows.matrix(len(weights)), rows.labels, weights)


def compact_objective(matrix: Any, labels: np.ndarray, weights: np.ndarray, l1: float) -> float:
    """``objective`` on ``matrix`` (one column per weight, e.g. ``local_matrix``'s). Weights left
    out add nothing to it when they are 0."""
    margins = matrix @ weights.astype(np.float64)
    return mean_loss(margins, labels) + l1 * float(np.abs(weights, dtype=np.float64).sum())


def compact_accuracy(matrix: Any, labels: np.ndarray, weights: np.ndarray) -> float:
    margins = matrix @ weights.astype(np.float64)
    return float(np.mean((margins > 0) == (labels == 1)))


def working_set(rows: SparseSplit) -> np.ndarray:
    """The sorted distinct features of ``rows``: the keys a batch pulls and pushes."""
    return np.unique(rows.indices).astype(np.int64)


def kkt_mask(weights: np.ndarray, grad: np.ndarray, l1: float) -> np.ndarray:
    """True where a key must be pushed: not (weight 0 and |g| <= l1)."""
    mask: np.ndarray = (weights != 0) | (np.abs(grad) > np.float32(l1))
    return mask
