"""The DLRM-style click model (engine.models.embedding): its keys and their rules, the working
set a batch pulls, its hand-written gradient against finite differences, that it learns a
synthetic click set by plain SGD on working sets, and the AUC and log loss it is measured by."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from engine import initial
from engine.config import ModelConfig
from engine.datasets.sparse import SparseSplit, generate, parse
from engine.errors import ConfigError
from engine.keys import KeyLayout
from engine.models.embedding import (
    EMBED_STD,
    EmbeddingMLP,
    EmbeddingSpec,
    auc,
    embedding_layout,
    log_loss,
)
from engine.models.rows import rows_model
from engine.plan import build_config

SMALL = EmbeddingSpec(features=50, dim=3, hidden=4)


def split(rows: list[list[tuple[int, float]]], labels: list[int]) -> SparseSplit:
    """A SparseSplit of rows given as (feature, value) pairs."""
    indptr = np.cumsum([0] + [len(row) for row in rows]).astype(np.int64)
    pairs = [pair for row in rows for pair in row]
    return SparseSplit(indptr, np.array([f for f, _ in pairs], dtype=np.int32),
                       np.array([v for _, v in pairs], dtype=np.float32),
                       np.array(labels, dtype=np.int64))


# Six rows over features 2..47 (some shared, one row of a single feature, values other than 1).
BATCH = split([[(2, 1.0), (7, 1.0), (40, 1.0)], [(7, 1.0), (11, 0.5)], [(3, 1.0)],
               [(2, 1.0), (11, 1.0), (29, 2.0), (47, 1.0)], [(29, 1.0), (40, 1.0)],
               [(3, 1.0), (7, 1.0), (19, 1.0)]], [1, 0, 0, 1, 1, 0])
USED = [2, 3, 7, 11, 19, 29, 40, 47]


def starting_values(layout: KeyLayout, keys: np.ndarray, seed: int = 0) -> np.ndarray:
    """What the servers start ``keys`` (sorted) from: each segment's rule."""
    values = np.empty(len(keys), dtype=np.float32)
    for segment in layout.segments:
        inside = (keys >= segment.keys.start) & (keys < segment.keys.end)
        assert segment.init is not None
        values[inside] = initial.values(segment.init, keys[inside], seed)
    return values


def test_the_layout_is_a_sparse_table_then_dense_layers_each_with_a_rule() -> None:
    spec = EmbeddingSpec(features=1000, dim=8, hidden=32)
    layout = embedding_layout(spec)
    table = 1000 * 8
    assert [(s.name, s.shape, s.keys.start, s.keys.end, s.sparse) for s in layout.segments] == [
        ("embedding", (1000, 8), 0, table, True),
        ("fc1.weight", (32, 8), table, table + 256, False),
        ("fc1.bias", (32,), table + 256, table + 288, False),
        ("out.weight", (1, 32), table + 288, table + 320, False),
        ("out.bias", (1,), table + 320, table + 321, False),
    ]
    assert [s.init for s in layout.segments] == [
        f"normal:{EMBED_STD}", "normal:0.5", "zeros", f"normal:{math.sqrt(1 / 32)}", "zeros"]
    for segment in layout.segments:
        assert segment.init is not None and initial.check(segment.init) == segment.init
    model = EmbeddingMLP(spec)
    assert model.num_keys == layout.num_keys == table + 321
    assert model.spec == spec and model.initial_values() is None
    assert EmbeddingSpec(features=7).dim == 8 and EmbeddingSpec(features=7).hidden == 32


def test_a_table_of_up_to_2_to_the_62_keys_is_laid_out_and_nothing_past_the_limits() -> None:
    layout = embedding_layout(EmbeddingSpec(features=2**62 // 8, dim=8, hidden=4096))
    assert layout.segments[0].keys.end == 2**62
    assert layout.num_keys == 2**62 + 4096 * 8 + 2 * 4096 + 1
    bad = [dict(features=1), dict(features=2**62 // 8 + 1), dict(features=2**60, dim=5),
           dict(features=10, dim=0), dict(features=10, dim=257), dict(features=10, hidden=0),
           dict(features=10, hidden=4097), dict(features=10, dim=True),
           dict(features=10.0)]
    for fields in bad:
        with pytest.raises(ConfigError, match="embedding model"):
            EmbeddingSpec(**fields)  # type: ignore[arg-type]


def test_the_dim_setting_sizes_the_rows_of_the_run_model() -> None:
    config = build_config({}, {"data.dataset": "sparse-synthetic:features=1000",
                               "model.name": "embedding", "model.embedding.dim": 4})
    model = rows_model(config.model, 1000)
    assert isinstance(model, EmbeddingMLP) and model.spec == EmbeddingSpec(1000, 4, 512)
    table, fc1 = model.layout().segments[:2]
    assert (table.shape, table.keys.end, fc1.shape) == ((1000, 4), 1000 * 4, (512, 4))
    assert model.num_keys == 1000 * 4 + 512 * (4 + 2) + 1
    default = rows_model(ModelConfig(name="embedding", hidden=(32,)), 1000)
    assert isinstance(default, EmbeddingMLP) and default.spec == EmbeddingSpec(1000, 8, 32)


def test_the_working_set_is_the_rows_the_batch_uses_then_every_dense_key() -> None:
    model = EmbeddingMLP(SMALL)
    keys = model.working_set(BATCH)
    rows = [3 * f + j for f in USED for j in range(3)]
    dense = list(range(150, model.num_keys))
    assert keys.dtype == np.int64 and keys.tolist() == rows + dense
    assert len(dense) == 4 * 3 + 4 + 4 + 1
    wide = with_int64_ids(BATCH)  # int64 column ids, as above 2^31 - 1 features
    np.testing.assert_array_equal(model.working_set(wide), keys)


def with_int64_ids(rows: SparseSplit) -> SparseSplit:
    return SparseSplit(rows.indptr, rows.indices.astype(np.int64), rows.values, rows.labels)


def reference_logits(spec: EmbeddingSpec, rows: SparseSplit, values: np.ndarray,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(logits, fc1's pre-activations) of the model written out densely, ``values`` the whole
    key space's."""
    table_end = spec.features * spec.dim
    table = values[:table_end].reshape(spec.features, spec.dim)
    dense = values[table_end:]
    w1 = dense[:spec.hidden * spec.dim].reshape(spec.hidden, spec.dim)
    b1 = dense[spec.hidden * spec.dim:spec.hidden * (spec.dim + 1)]
    w_out, b_out = dense[spec.hidden * (spec.dim + 1):-1], dense[-1]
    pre = rows.matrix(spec.features).toarray().astype(np.float64) @ table @ w1.T + b1
    logits: np.ndarray = np.maximum(pre, 0) @ w_out + b_out
    return logits, pre


# dim 3, and dim 4 as the run's setting builds it (--embedding-dim 4).
DIM_4 = ModelConfig(name="embedding", hidden=(4,), embedding={"dim": 4})


@pytest.mark.parametrize("model", [EmbeddingMLP(SMALL), rows_model(DIM_4, 50)],
                         ids=["dim-3", "dim-4-set"])
def test_the_gradient_matches_central_differences_on_every_key(model: EmbeddingMLP) -> None:
    assert model.spec.dim in (3, 4) and model.features == 50
    everything = np.random.default_rng(3).normal(0.0, 0.6, model.num_keys)
    logits, pre = reference_logits(model.spec, BATCH, everything)
    # A ReLU within reach of a step of eps would make the difference quotient meaningless, and a
    # unit dead on every row would leave its keys' gradients 0 on both sides: neither here.
    assert np.abs(pre).min() > 0.02 and (pre > 0).any(axis=0).all()
    keys = model.working_set(BATCH)
    values = everything[keys]
    loss, grad = model.gradient(BATCH, keys, values)
    assert grad.dtype == np.float32 and grad.shape == keys.shape
    direct = np.mean(np.logaddexp(0, logits) - BATCH.labels * logits)
    assert loss == pytest.approx(direct, rel=1e-12)

    eps = 1e-4
    numeric = np.empty(len(keys))
    for i in range(len(keys)):
        up, down = values.copy(), values.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = (model.gradient(BATCH, keys, up)[0]
                      - model.gradient(BATCH, keys, down)[0]) / (2 * eps)
    assert np.abs(numeric).min() > 1e-5  # every key's gradient is measured, none is 0
    relative = np.abs(grad - numeric) / np.maximum(np.abs(grad), np.abs(numeric))
    assert relative.max() < 1e-3, (keys[relative.argmax()], relative.max())


def test_keys_the_batch_does_not_use_get_no_gradient_and_the_loss_is_the_log_loss() -> None:
    model = EmbeddingMLP(SMALL)
    everything = starting_values(embedding_layout(model.spec), np.arange(model.num_keys), seed=5)
    keys = model.working_set(BATCH)
    loss, grad = model.gradient(BATCH, keys, everything[keys])
    unused = np.setdiff1d(np.arange(50), USED)
    assert not np.isin(keys // 3, unused).any()  # no row of an unused feature is pulled

    # Given the whole key space (a sorted superset), the batch's keys get the same gradient
    # and every other key 0.
    all_keys = np.arange(model.num_keys)
    full_loss, full = model.gradient(BATCH, all_keys, everything)
    assert full_loss == loss
    np.testing.assert_array_equal(full[keys], grad)
    assert not full[np.setdiff1d(all_keys, keys)].any()

    probabilities = model.predict(BATCH, keys, everything[keys])
    assert probabilities.dtype == np.float64 and probabilities.shape == (6,)
    assert loss == pytest.approx(log_loss(BATCH.labels, probabilities), rel=1e-9)
    np.testing.assert_array_equal(model.predict(BATCH, all_keys, everything), probabilities)


def test_keys_missing_a_row_or_a_dense_key_are_refused() -> None:
    model = EmbeddingMLP(SMALL)
    keys = model.working_set(BATCH)
    # A row's first, middle and last key; the first, a middle and the last dense key.
    for missing in (0, 1, len(keys) - 22, len(keys) - 21, len(keys) - 5, len(keys) - 1):
        short = np.delete(keys, missing)
        with pytest.raises(ValueError, match="working_set"):
            model.gradient(BATCH, short, np.zeros(len(short), dtype=np.float32))


# 300 steps of plain SGD with batches of 100 (7.5 epochs), learning rate 0.5: the servers'
# arithmetic on the pushes, one worker.
STEPS, BATCH_SIZE, LEARNING_RATE = 300, 100, 0.5


def test_plain_sgd_on_working_sets_learns_a_synthetic_click_set() -> None:
    train, test, _ = generate(parse("sparse-synthetic:features=2000,nnz=10,samples=4000,"
                                    "test=1000"))
    model = EmbeddingMLP(EmbeddingSpec(features=2000))
    stored = np.zeros(model.num_keys, dtype=np.float32)  # a sparse server: keys made on touch
    made = np.zeros(model.num_keys, dtype=bool)

    def pull(keys: np.ndarray) -> np.ndarray:
        fresh = keys[~made[keys]]
        stored[fresh] = starting_values(embedding_layout(model.spec), fresh, seed=0)
        made[fresh] = True
        pulled: np.ndarray = stored[keys]
        return pulled

    def measure(rows: SparseSplit) -> tuple[float, float]:
        keys = model.working_set(rows)
        probabilities = model.predict(rows, keys, pull(keys))
        return log_loss(rows.labels, probabilities), auc(rows.labels, probabilities)

    (train_before, _), (test_before, auc_before) = measure(train), measure(test)
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        batch = train.rows(rng.choice(len(train), BATCH_SIZE, replace=False))
        keys = model.working_set(batch)
        _, grad = model.gradient(batch, keys, pull(keys))
        stored[keys] -= LEARNING_RATE * grad
    (train_after, _), (test_after, auc_after) = measure(train), measure(test)
    # Measured: train log loss 0.695 -> 0.327, test 0.695 -> 0.564, test AUC 0.47 -> 0.796
    # (logistic regression on the same data, scikit-learn, C=1: AUC 0.80).
    assert train_before > 0.69 and train_after < 0.4
    assert test_after < test_before - 0.1
    assert auc_before < 0.55 and auc_after > 0.77


def pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The share of (positive, negative) pairs the positive scores higher, a tie a half."""
    won = 0.0
    positives, negatives = scores[labels == 1], scores[labels == 0]
    for p, n in itertools.product(positives, negatives):
        won += 1.0 if p > n else 0.5 if p == n else 0.0
    return won / (len(positives) * len(negatives))


def test_auc_is_the_pairwise_count_ties_a_half_and_nan_without_both_classes() -> None:
    rng = np.random.default_rng(1)
    for size in (1, 2, 7, 60, 200):
        labels = rng.integers(0, 2, size)
        scores = rng.integers(0, 5, size).astype(np.float64)  # many ties
        if len(set(labels.tolist())) < 2:
            assert math.isnan(auc(labels, scores))
            continue
        assert auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)
        continuous = rng.random(size)
        assert auc(labels, continuous) == pytest.approx(pairwise_auc(labels, continuous),
                                                        abs=1e-12)
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert auc(np.array([1, 1, 0, 0]), np.array([0.1, 0.2, 0.3, 0.4])) == 0.0
    assert auc(np.array([1, 0, 1, 0]), np.full(4, 0.5)) == 0.5
    assert math.isnan(auc(np.ones(5, dtype=np.int64), rng.random(5)))


def test_log_loss_is_the_mean_cross_entropy_with_clipped_probabilities() -> None:
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 2, 50)
    probabilities = rng.random(50)
    direct = -np.mean([math.log(p) if y == 1 else math.log(1 - p)
                       for y, p in zip(labels, probabilities, strict=True)])
    assert log_loss(labels, probabilities) == pytest.approx(direct, rel=1e-12)
    assert log_loss(np.array([1, 0]), np.array([0.0, 1.0])) == pytest.approx(-math.log(1e-7))
    assert log_loss(np.array([1, 0]), np.array([1.0, 0.0])) == pytest.approx(-math.log1p(-1e-7))
