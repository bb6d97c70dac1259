"""A small DLRM-style click model for sparse samples (issue 44): an embedding bag over the
sample's features, one ReLU layer, one logit. numpy and scipy only, like ``engine.models.logreg``.

The embedding table is a *sparse* key range (the servers store a row only once it was pushed,
starting it from its ``init`` rule), the layers after it are dense ranges. A batch pulls the rows
its features use and every dense key (``working_set``), computes its loss and gradient here on
those keys, and pushes the gradient on the same keys: nothing is as large as the feature space.

For a sample b with features f of value x_bf::

    e_b = sum_f x_bf E[f]          (the bag: a sum of the rows of table E)
    h_b = relu(W1 e_b + b1)
    o_b = w_out . h_b + b_out,     p_b = sigmoid(o_b)
    loss = mean_b(log(1 + exp(o_b)) - y_b o_b)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.datasets.sparse import SparseSplit
from engine.errors import ConfigError
from engine.keys import KeyLayout, KeyRange, Segment
from engine.models.kinds import DIM, MAX_DIM, MODELS, EmbeddingSettings
from engine.models.rows import Measured

if TYPE_CHECKING:
    from engine.config import ModelConfig

# The table's rows start as normal(0, EMBED_STD) draws: not 0, where the bag, the ReLU layer's
# input, would be 0 and no row would ever get a gradient, but small, because a row keeps most of
# its random start until its feature has been seen often, and with power-law feature frequencies
# most features are seen in few samples: their start is noise added to every bag they are in. A
# row's gradient does not shrink with it (it flows back through fc1's weights, not the bag).
# DLRM's reference code draws rows uniformly in +-sqrt(1/rows), std 0.013 for 2,000 rows. On the
# sanity set of tests/engine/models/test_embedding.py (nnz=10, three data seeds) 0.01 reached a
# test AUC of 0.80, 0.81 and 0.77, 0.1 0.78, 0.80 and 0.74, 0.3 0.74; with nnz=50 (learning
# rate 0.1), 0.89 against 0.80 for 0.1.
EMBED_STD = 0.01
MAX_HIDDEN = 4096
MAX_KEYS = 2**62
# log_loss clips probabilities to [EPSILON, 1 - EPSILON], so that one confident mistake costs
# about 16, not infinity.
EPSILON = 1e-7


@dataclass(frozen=True)
class EmbeddingSpec:
    """``features`` rows (the data set's feature space) of ``dim`` values each, and ``hidden``
    ReLU units between the bag and the logit."""

    features: int
    dim: int = DIM
    hidden: int = 32

    def __post_init__(self) -> None:
        _check("dim", self.dim, 1, MAX_DIM)
        _check("hidden", self.hidden, 1, MAX_HIDDEN)
        # The table's keys, features * dim, must stay within the 2^62 a key space may hold.
        _check("features", self.features, 2, MAX_KEYS // self.dim)


def _check(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"embedding model: {name} must be a whole number in {low}..{high}, "
                          f"got {value!r}")


def embedding_layout(spec: EmbeddingSpec) -> KeyLayout:
    """The table (row f, column j is key f * dim + j; sparse), then fc1's weight and bias and
    the output's weight and bias (dense), each with the rule the servers start it from."""
    table = spec.features * spec.dim
    shapes: list[tuple[str, tuple[int, ...], str]] = [
        ("fc1.weight", (spec.hidden, spec.dim), f"normal:{math.sqrt(2 / spec.dim)!r}"),  # He
        ("fc1.bias", (spec.hidden,), "zeros"),
        ("out.weight", (1, spec.hidden), f"normal:{math.sqrt(1 / spec.hidden)!r}"),
        ("out.bias", (1,), "zeros"),
    ]
    segments = [Segment("embedding", (spec.features, spec.dim), KeyRange(0, table), sparse=True,
                        init=f"normal:{EMBED_STD!r}")]
    for name, shape, init in shapes:
        start = segments[-1].keys.end
        segments.append(Segment(name, shape, KeyRange(start, start + math.prod(shape)),
                                init=init))
    return KeyLayout(tuple(segments))


@dataclass(frozen=True)
class _Dense:
    """The dense layers' values, float64."""

    w1: np.ndarray  # (hidden, dim)
    b1: np.ndarray  # (hidden,)
    w_out: np.ndarray  # (hidden,)
    b_out: float


@dataclass(frozen=True)
class _Batch:
    """Where a batch's keys lie in the key array it came with."""

    bag: Any  # CSR, rows x the batch's distinct features, float64
    rows: np.ndarray  # (distinct features, dim): the index in ``keys`` of each table value
    dense: slice  # the dense keys in ``keys``


@dataclass(frozen=True)
class _Forward:
    embedded: np.ndarray  # (rows, dim)
    pre: np.ndarray  # (rows, hidden): before the ReLU
    hidden: np.ndarray
    logits: np.ndarray  # (rows,)


class EmbeddingMLP:
    """The model's arithmetic on a batch's keys. Like ``SparseLogReg`` it holds no values: the
    servers start every key from its layout rule, so worker 0 sends nothing."""

    def __init__(self, spec: EmbeddingSpec) -> None:
        self.spec = spec
        self.features = spec.features
        self.num_keys = embedding_layout(spec).num_keys
        self._table_keys = spec.features * spec.dim

    def layout(self) -> KeyLayout:
        return embedding_layout(self.spec)

    def evaluation(self, train: SparseSplit, test: SparseSplit, l1: float) -> ClickEvaluation:
        return ClickEvaluation(self, test)

    @staticmethod
    def initial_values() -> np.ndarray | None:
        """None: every segment has an ``init`` rule the servers start its keys from."""
        return None

    def working_set(self, rows: SparseSplit) -> np.ndarray:
        """The sorted int64 keys a batch pulls and pushes: every value of the table rows its
        features use, then every dense key."""
        features = np.unique(rows.indices).astype(np.int64)
        table = (features[:, None] * self.spec.dim + np.arange(self.spec.dim)).ravel()
        return np.concatenate([table, np.arange(self._table_keys, self.num_keys)])

    def gradient(self, rows: SparseSplit, keys: np.ndarray,
                 values: np.ndarray) -> tuple[float, np.ndarray]:
        """(mean log loss over ``rows``, its float32 gradient aligned with ``keys``), with
        ``keys`` ``working_set(rows)`` or a sorted superset and ``values`` their values. Keys
        the batch does not use get 0."""
        batch = self._locate(rows, keys)
        table, dense = self._unpack(batch, values)
        forward = _forward(batch.bag, table, dense)
        loss = float(np.mean(np.logaddexp(0.0, forward.logits) - rows.labels * forward.logits))
        table_grad, dense_grad = _backward(batch.bag, forward, dense, rows.labels)
        grad = np.zeros(len(keys), dtype=np.float32)
        grad[batch.rows] = table_grad
        grad[batch.dense] = dense_grad
        return loss, grad

    def predict(self, rows: SparseSplit, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The click probability (float64) of each of ``rows``; ``keys`` and ``values`` as for
        ``gradient``."""
        from scipy.special import expit

        batch = self._locate(rows, keys)
        table, dense = self._unpack(batch, values)
        probabilities: np.ndarray = expit(_forward(batch.bag, table, dense).logits)
        return probabilities

    def _locate(self, rows: SparseSplit, keys: np.ndarray) -> _Batch:
        from scipy.sparse import csr_matrix

        features, local = np.unique(rows.indices, return_inverse=True)
        firsts = features.astype(np.int64) * self.spec.dim
        starts = np.searchsorted(keys, firsts)
        dense_start = int(np.searchsorted(keys, self._table_keys))
        dense = slice(dense_start, dense_start + self.num_keys - self._table_keys)
        if not (_holds(keys, firsts, starts, self.spec.dim)
                and _holds(keys, np.array([self._table_keys]), np.array([dense.start]),
                           dense.stop - dense.start)):
            raise ValueError("keys must be sorted and hold working_set(rows)")
        bag = csr_matrix((rows.values.astype(np.float64), local.ravel(), rows.indptr),
                         shape=(len(rows), len(features)))
        return _Batch(bag, starts[:, None] + np.arange(self.spec.dim), dense)

    def _unpack(self, batch: _Batch, values: np.ndarray) -> tuple[np.ndarray, _Dense]:
        hidden, dim = self.spec.hidden, self.spec.dim
        table = values[batch.rows].astype(np.float64)
        flat = values[batch.dense].astype(np.float64)
        w1_end, b1_end = hidden * dim, hidden * dim + hidden
        dense = _Dense(w1=flat[:w1_end].reshape(hidden, dim), b1=flat[w1_end:b1_end],
                       w_out=flat[b1_end:b1_end + hidden], b_out=float(flat[-1]))
        return table, dense


def _holds(keys: np.ndarray, firsts: np.ndarray, starts: np.ndarray, width: int) -> bool:
    """Whether sorted distinct ``keys`` hold firsts[i] .. firsts[i] + width - 1 at starts[i]
    on: they do exactly when the block's first and last keys are where they would be, as a
    key missing in between would shift the last one."""
    lasts = starts + width - 1
    if np.any(lasts >= len(keys)):
        return False
    return bool(np.all(keys[starts] == firsts) and np.all(keys[lasts] == firsts + width - 1))


def _forward(bag: Any, table: np.ndarray, dense: _Dense) -> _Forward:
    embedded = np.asarray(bag @ table)
    pre = embedded @ dense.w1.T + dense.b1
    hidden = np.maximum(pre, 0.0)
    return _Forward(embedded, pre, hidden, hidden @ dense.w_out + dense.b_out)


def _backward(bag: Any, forward: _Forward, dense: _Dense,
              labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the gradient of the batch's table rows, (distinct features, dim); the dense layers'
    gradient in key order), both float64."""
    from scipy.special import expit

    d_logits = (expit(forward.logits) - labels) / len(labels)
    d_pre = np.outer(d_logits, dense.w_out) * (forward.pre > 0)
    d_embedded = d_pre @ dense.w1
    table_grad = np.asarray(bag.T @ d_embedded)
    dense_grad = np.concatenate([(d_pre.T @ forward.embedded).ravel(), d_pre.sum(axis=0),
                                 d_logits @ forward.hidden, [d_logits.sum()]])
    return table_grad, dense_grad


def sparse_model(features: int, model: ModelConfig) -> EmbeddingMLP:
    """The model of a run of ``--model embedding`` (engine.models.kinds): rows of its own
    setting's ``dim`` values (``[model.embedding]``, ``--embedding-dim``), one ReLU layer of the
    first ``model.hidden`` width."""
    dim = MODELS.settings_of("embedding", model, EmbeddingSettings).dim
    return EmbeddingMLP(EmbeddingSpec(features, dim, model.hidden[0] if model.hidden else HIDDEN))


# ``--model embedding``'s layer's width when model.hidden gives none.
HIDDEN = 32


class ClickEvaluation:
    """The test set's log loss (the run's loss), accuracy at p = 0.5 and ROC AUC (a metric,
    ``auc``), from the table rows of its features and every dense key."""

    def __init__(self, model: EmbeddingMLP, test: SparseSplit) -> None:
        self.model, self.test = model, test
        self.keys = model.working_set(test)

    def measure(self, values: np.ndarray) -> Measured:
        p = self.model.predict(self.test, self.keys, values)
        labels = self.test.labels
        area = auc(labels, p)  # NaN when the test set has one class: nothing to log then
        return Measured(loss=log_loss(labels, p),
                        accuracy=float(np.mean((p > 0.5) == (labels == 1))),
                        metrics={"auc": area} if math.isfinite(area) else {})


def log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """The mean log loss of ``probabilities`` of label 1, clipped to [1e-7, 1 - 1e-7]."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), EPSILON, 1.0 - EPSILON)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` for ``labels`` 0/1: the Mann-Whitney U of the
    positives' ranks over (positives x negatives), ties given their average rank, so that a
    tied pair counts a half. NaN when one class is missing."""
    positive = np.asarray(labels) == 1
    positives = int(positive.sum())
    negatives = len(positive) - positives
    if positives == 0 or negatives == 0:
        return math.nan
    ranks = average_ranks(np.asarray(scores))
    rank_sum = float(ranks[positive].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def average_ranks(scores: np.ndarray) -> np.ndarray:
    """The 1-based rank (float64) of each of ``scores``, tied scores sharing their mean rank."""
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.append(starts[1:], len(scores))
    ranks = np.empty(len(scores), dtype=np.float64)
    # A tie group in positions start..end-1 holds ranks start+1..end, whose mean is this:
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks
