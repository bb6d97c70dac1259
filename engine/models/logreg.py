"""Sparse binary logistic regression (seed 003's workload): the model a sparse run trains, its
gradient on a batch's working set, and the objective and accuracy the evaluator reports. numpy
and scipy only: the worker's sparse loop (engine.worker.sparse) and the evaluator share it."""

from __future__ import annotations

import numpy as np

from engine.datasets.sparse import SparseSplit


class SparseLogReg:
    """Binary logistic regression over ``features`` weights; ``params_np`` is the whole model
    (the initial values worker 0 sends, and what the evaluator pulls into)."""

    def __init__(self, features: int) -> None:
        self.params_np = np.zeros(features, dtype=np.float32)

    @staticmethod
    def gradient(rows: SparseSplit, keys: np.ndarray,
                 weights: np.ndarray) -> tuple[float, np.ndarray]:
        """(mean logistic loss, its gradient on ``keys``) for ``rows``, whose features all lie
        in ``keys`` (sorted), with ``weights`` the values of ``keys``."""
        from scipy.sparse import csr_matrix
        from scipy.special import expit

        local = np.searchsorted(keys, rows.indices)
        matrix = csr_matrix((rows.values, local, rows.indptr), shape=(len(rows), len(keys)))
        margins = matrix @ weights.astype(np.float64)
        labels = rows.labels
        loss = float(np.mean(np.logaddexp(0.0, margins) - labels * margins))
        grad = matrix.T @ ((expit(margins) - labels) / len(rows))
        return loss, np.asarray(grad, dtype=np.float32)


def objective(weights: np.ndarray, rows: SparseSplit, l1: float) -> float:
    """Mean logistic loss over ``rows`` plus l1 * |w|_1: what the run minimises."""
    margins = rows.matrix(len(weights)) @ weights.astype(np.float64)
    loss = np.mean(np.logaddexp(0.0, margins) - rows.labels * margins)
    return float(loss + l1 * np.abs(weights, dtype=np.float64).sum())


def accuracy(weights: np.ndarray, rows: SparseSplit) -> float:
    margins = rows.matrix(len(weights)) @ weights.astype(np.float64)
    return float(np.mean((margins > 0) == (rows.labels == 1)))


def working_set(rows: SparseSplit) -> np.ndarray:
    """The sorted distinct features of ``rows``: the keys a batch pulls and pushes."""
    return np.unique(rows.indices).astype(np.int64)


def kkt_mask(weights: np.ndarray, grad: np.ndarray, l1: float) -> np.ndarray:
    """True where a key must be pushed: not (weight 0 and |g| <= l1)."""
    mask: np.ndarray = (weights != 0) | (np.abs(grad) > np.float32(l1))
    return mask
