"""The sparse logistic-regression worker's arithmetic: the gradient on a working set is the full
gradient's restriction, the KKT filter drops exactly the keys a proximal step keeps at 0."""

from __future__ import annotations

import numpy as np
import pytest

from engine.datasets.sources import load_sparse
from engine.datasets.sparse import parse
from engine.models.logreg import SparseLogReg, accuracy, kkt_mask, objective, working_set

DATA = load_sparse("sparse-synthetic:features=2000,nnz=10,samples=400,test=100,seed=1")


def dense_gradient(weights: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
    margins = rows @ weights.astype(np.float64)
    return rows.T @ (1 / (1 + np.exp(-margins)) - labels) / len(labels)


def test_the_working_set_gradient_is_the_full_gradient_restricted() -> None:
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.3, 2000).astype(np.float32)
    batch = DATA.train.rows(np.arange(32))
    keys = working_set(batch)
    assert (np.diff(keys) > 0).all() and len(keys) <= 320
    loss, grad = SparseLogReg.gradient(batch, keys, weights[keys])
    full = dense_gradient(weights, batch.matrix(2000).toarray(), batch.labels)
    np.testing.assert_allclose(grad, full[keys], rtol=1e-5, atol=1e-7)
    outside = np.setdiff1d(np.arange(2000), keys)
    assert np.all(full[outside] == 0)  # nothing is lost by pushing the working set alone
    assert abs(loss - objective(weights, batch, 0.0)) < 1e-6


def test_objective_adds_the_l1_penalty_and_accuracy_counts_signs() -> None:
    weights = np.zeros(2000, dtype=np.float32)
    assert objective(weights, DATA.train, 0.5) == pytest.approx(np.log(2), rel=1e-12)
    weights[:3] = [1, -2, 0.5]
    assert objective(weights, DATA.train, 0.1) == pytest.approx(
        objective(weights, DATA.train, 0.0) + 0.35, rel=1e-12)
    labels = DATA.test.labels
    assert accuracy(np.zeros(2000, np.float32), DATA.test) == np.mean(labels == 0)


def test_the_kkt_mask_keeps_nonzero_weights_and_large_gradients() -> None:
    weights = np.array([0, 0, 0.3, 0, -1], dtype=np.float32)
    grad = np.array([0.01, 0.5, 0.0, -0.2, 0.0], dtype=np.float32)
    assert kkt_mask(weights, grad, 0.1).tolist() == [False, True, True, True, True]


def test_spec_of_the_data_used_here() -> None:
    assert parse(DATA.spec.name).features == 2000
