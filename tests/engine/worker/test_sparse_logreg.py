"""The sparse logistic-regression worker's arithmetic: the gradient on a working set is the full
gradient's restriction, the KKT filter drops exactly the keys a proximal step keeps at 0; the
model holds no weights, and the evaluator measures on the keys it pulled what the dense model
gives."""

from __future__ import annotations

import numpy as np
import pytest

from engine.datasets.sources import load_sparse
from engine.datasets.sparse import parse
from engine.errors import RunFailed
from engine.models.logreg import SparseLogReg, accuracy, kkt_mask, objective, working_set
from engine.roles.evaluator import SparseEvaluator
from engine.roles.worker import check_rows_layout
from engine.wire.messages import SegmentInfo, Welcome
from engine.wire.protocol import ANY_CLOCK
from engine.worker.client import PullResult

DATA = load_sparse("sparse-synthetic:features=2000,nnz=10,samples=400,test=100,seed=1")


def dense_gradient(weights: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
    margins = rows @ weights.astype(np.float64)
    gradient: np.ndarray = rows.T @ (1 / (1 + np.exp(-margins)) - labels) / len(labels)
    return gradient


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


class DenseServers:
    """A stand-in for the evaluator's client: answers pulls of sorted keys from a dense array,
    each at its own version, and keeps what was asked."""

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights
        self.asked: list[np.ndarray] = []
        self._answers: dict[int, PullResult] = {}

    def pull(self, keys: np.ndarray, out: np.ndarray, *, clock: int) -> int:
        assert clock == ANY_CLOCK and keys.dtype == np.int64 and (np.diff(keys) > 0).all()
        assert out.dtype == np.float32 and out.shape == keys.shape
        out[:] = self.weights[keys]
        self.asked.append(keys.copy())
        handle = len(self.asked)
        self._answers[handle] = PullResult({0: 10 * handle, 1: handle}, 0.0, 0, 0)
        return handle

    def wait(self, handle: int) -> PullResult:
        return self._answers.pop(handle)


def evaluator_of(weights: np.ndarray, l1: float) -> tuple[SparseEvaluator, DenseServers]:
    servers = DenseServers(weights)
    evaluation = SparseLogReg(2000).evaluation(DATA.train, DATA.test, l1)
    return SparseEvaluator(evaluation, servers, started_at=0.0), servers  # type: ignore[arg-type]


def test_the_evaluator_pulls_the_splits_features_and_measures_what_the_dense_model_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.roles.evaluator.PULL_KEYS", 300)
    rng = np.random.default_rng(4)
    weights = np.where(rng.random(2000) < 0.3, rng.normal(0, 0.5, 2000), 0).astype(np.float32)
    evaluator, servers = evaluator_of(weights, 1e-3)
    row = evaluator.measure(epoch=1.5)
    features = np.union1d(DATA.train.indices, DATA.test.indices)
    assert all(len(keys) <= 300 for keys in servers.asked) and len(servers.asked) > 1
    np.testing.assert_array_equal(np.concatenate(servers.asked), features)
    dense = np.zeros(2000, dtype=np.float32)  # what the old evaluator pulled: every key
    dense[features] = weights[features]
    assert row.loss == pytest.approx(objective(dense, DATA.train, 1e-3), rel=1e-12, abs=0)
    assert row.accuracy == accuracy(dense, DATA.test)
    assert evaluator.facts == {"nonzero": np.count_nonzero(dense)}
    assert row.step == 10 * len(servers.asked) and row.epoch == 1.5  # the newest piece's


def test_the_evaluator_of_a_zero_model_reports_log_2_and_the_majority_class() -> None:
    evaluator, servers = evaluator_of(np.zeros(2000, dtype=np.float32), 0.5)
    row = evaluator.measure(epoch=0.0)
    assert len(servers.asked) == 1 and evaluator.facts == {"nonzero": 0}
    assert row.loss == pytest.approx(np.log(2), rel=1e-12)
    assert row.accuracy == np.mean(DATA.test.labels == 0)


def test_the_sparse_model_holds_no_weights_and_sends_no_initial_values() -> None:
    model = SparseLogReg(2**40)
    assert model.initial_values() is None and not hasattr(model, "params_np")


def welcome_of(segment: SegmentInfo) -> Welcome:
    return Welcome(run_id="00" * 16, config={}, num_keys=segment.end, segments=[segment],
                   shards=[], started_at=0.0)


def test_a_sparse_model_needs_its_keys_laid_out_as_one_sparse_range() -> None:
    sparse = SegmentInfo(name="weight", shape=(2**40,), start=0, end=2**40, sparse=True)
    check_rows_layout(SparseLogReg(2**40), welcome_of(sparse))
    with pytest.raises(RunFailed, match="lays out other keys than the coordinator's: .*"
                                        "sparse=True.* here, .*sparse=False.* there"):
        check_rows_layout(SparseLogReg(2**40),
                          welcome_of(sparse.model_copy(update={"sparse": False})))
    with pytest.raises(RunFailed, match="other keys"):
        check_rows_layout(SparseLogReg(2000), welcome_of(sparse))
