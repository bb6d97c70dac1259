"""``sparse-synthetic:features=1000000,nnz=50``: the sparse logistic-regression workload of seed 003
(OSDI'14), made here because its ad-click data is not public.

Every sample has about ``nnz`` features of value 1, drawn with power-law frequencies (the k-th
most frequent feature with probability proportional to k^-``alpha``, so a few features appear in
most samples and most in almost none). A known weight vector is nonzero on a ``density`` share of
the features, normal; a sample's label is 1 when its margin plus Gaussian noise (``noise`` times
the margins' standard deviation) is positive. Every process that loads it makes the same arrays
from ``seed``: nothing is written to disk.

``ids`` says how a rank k (the k-th most frequent feature) becomes a feature id (a key):

- ``permuted`` (psctl's first method, kept bit for bit): a seeded permutation of the ``features``
  ids, so that frequent keys spread over every server's range; ranks are drawn by inverting the
  cumulative distribution, and the true weights are a dense array. Every one of these is as
  large as the feature space, so it takes ``features`` <= 2^31 - 1 (and memory to match).
- ``hashed``: the id of rank k is ``mix64(k, seed) % features`` (``engine.hashing``:
  SplitMix64's finaliser). That is feature hashing (the "hashing trick") as Vowpal Wabbit and
  scikit-learn's ``FeatureHasher`` do it, where a feature's column is a hash of it mod the column
  count: scikit-learn hashes the feature's *name* (a string) with MurmurHash3, 32-bit signed,
  takes ``abs(h) % n_features`` and flips the value's sign when h < 0; Vowpal Wabbit keeps the
  low b bits of its MurmurHash3 (2^b columns). psctl's features have no names, so it hashes the
  rank, with no sign; distinct ranks that land on one id share it, as colliding features share
  a column there (few collide while the features drawn are far fewer than ``features``). The
  true weight of id i is nonzero when ``unit_uniform(i, seed + 1) < density``, and then
  ``unit_normal(i, seed + 2)`` (float32): computed for the ids drawn alone. Nothing of the size
  of the feature space is allocated, so ``features`` may be up to 2^62 (column ids are int64
  above 2^31 - 1).
- ``auto`` (the default): permuted up to 10^7 features, else hashed. The spec written out
  (``canonical``) names the one chosen.

Hashed ids draw ranks from the exact discrete Zipf distribution P(k) ∝ k^-alpha on 1..N (N =
``features``) by **rejection-inversion** (Hörmann and Derflinger, "Rejection-inversion to generate
variates from monotone discrete distributions", ACM TOMACS 6(3), 1996), in O(1) memory per draw
whatever N. The paper's method, for a decreasing h(x) = x^-alpha with integral H: draw u
uniformly in [H(1.5) - h(1), H(N + 0.5)], set x = H^-1(u) and k = round(x), and accept k when
u >= H(k + 0.5) - h(k), else draw again. Accepted u are uniform on intervals of length h(k), one
per k, so P(k) ∝ h(k) exactly; h being convex, each interval fits in [H(k - 0.5), H(k + 0.5)]
and few draws are rejected (under 2 % for alpha <= 3). psctl draws a block at once in numpy and
redraws the rejected ones. It writes H(x) = (x^(1-alpha) - 1)/(1 - alpha) as log(x) · expm1(t)/t
with t = (1 - alpha) log x, and H^-1 with log1p(s)/s, so that alpha = 1 (where H is log x) is no
special case; it tests x >= H^-1(H(k + 0.5) - h(k)), in a form with no difference of H's values
(``_PowerLaw.lowest_accepted``), and accepts ranks above 2^20 untested (``SURE_RANK``). The
paper's squeeze, a cheaper early acceptance, is left out: the test is one vectorised pass.

Its arithmetic is float64's: u keeps 16 digits of H, so ranks whose share h(k) is below H's last
digit are not told apart from their neighbours, and some are drawn in place of others, over any
range of ranks in the right proportion. For N <= 2^40 that concerns under 10^-4 of the draws,
whatever alpha; with alpha near 1 or below, up to half of them at N = 2^53 and nearly all at
2^62 (in groups of up to about 10^3 ranks), which still leaves far more distinct ranks than a
data set draws.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import whole_number
from engine.errors import ConfigError
from engine.hashing import mix64, unit_normal, unit_uniform

PREFIX = "sparse-synthetic"
ID_METHODS = ("auto", "permuted", "hashed")
# ids=auto permutes up to this many features: its tables of every feature peak at about 35
# bytes a feature (350 MB and 3 s here).
PERMUTED_UP_TO = 10**7
MAX_FEATURES = 2**62
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class SyntheticSpec:
    """The data set's parameters; ``ids`` is resolved on creation (never "auto" afterwards)."""

    features: int = 1_000_000
    nnz: int = 50
    samples: int = 100_000
    test: int = 10_000
    alpha: float = 1.0
    density: float = 0.1
    noise: float = 0.1
    seed: int = 0
    ids: str = "auto"
    # 0: a label is 1 when margin + noise > 0; in (0, 1): when it is in the top ``ctr`` share of
    # both splits' margins + noise (a click data set: ctr=0.2 makes a fifth of them clicks).
    ctr: float = 0.0

    def __post_init__(self) -> None:
        if not 2 <= self.features <= MAX_FEATURES:
            raise ConfigError(f"{PREFIX}: features must be 2..2^62, got {self.features}")
        if not 1 <= self.nnz <= min(self.features, 10_000):
            raise ConfigError(f"{PREFIX}: nnz must be 1..min(features, 10000), got {self.nnz}")
        if not 1 <= self.samples <= 10_000_000 or not 1 <= self.test <= 10_000_000:
            raise ConfigError(f"{PREFIX}: samples and test must be 1..10^7")
        if not 0 < self.alpha <= 3 or not 0 < self.density <= 1 or not 0 <= self.noise <= 10:
            raise ConfigError(f"{PREFIX}: alpha must be in (0, 3], density in (0, 1], noise in "
                              "[0, 10]")
        if not 0 <= self.ctr < 1:
            raise ConfigError(f"{PREFIX}: ctr must be in [0, 1), got {self.ctr}")
        object.__setattr__(self, "ids", _resolved_ids(self.ids, self.features))


def _resolved_ids(ids: str, features: int) -> str:
    if ids not in ID_METHODS:
        raise ConfigError(f"{PREFIX}: ids must be one of {', '.join(ID_METHODS)}, got {ids!r}")
    if ids == "auto":
        return "permuted" if features <= PERMUTED_UP_TO else "hashed"
    if ids == "permuted" and features > INT32_MAX:
        raise ConfigError(f"{PREFIX}: ids=permuted holds tables of every feature: features must "
                          f"be at most 2^31-1 (got {features}); ids=hashed takes up to 2^62")
    return ids


def is_sparse_synthetic(text: str) -> bool:
    return text.strip().split(":", 1)[0] == PREFIX


def parse(text: str) -> SyntheticSpec:
    """``sparse-synthetic[:key=value,...]``; the keys are SyntheticSpec's fields. Whole numbers
    may have underscores and be powers (``features=2^40``)."""
    _, _, tail = text.strip().partition(":")
    fields = {f.name: f.type for f in dataclasses.fields(SyntheticSpec)}
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in tail.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise ConfigError(f"{PREFIX}: {item!r} is not KEY=VALUE with KEY one of "
                              f"{', '.join(fields)}")
        values[key] = _value(key, value.strip(), fields[key])
    return SyntheticSpec(**values)


def _value(key: str, text: str, kind: Any) -> int | float | str:
    if kind == "str":
        return text
    try:
        return float(text) if kind == "float" else whole_number(text)
    except ValueError as exc:
        raise ConfigError(f"{PREFIX}: {key}={text!r} is not a number") from exc


def canonical(spec: SyntheticSpec) -> str:
    """The spec written out in full, so that a stored run says exactly which data it had."""
    return PREFIX + ":" + ",".join(f"{f.name}={_written(getattr(spec, f.name))}"
                                   for f in dataclasses.fields(spec))


def _written(value: object) -> str:
    return value if isinstance(value, str) else repr(value)


@dataclass(frozen=True, eq=False)
class SparseSplit:
    """Rows of a CSR matrix (float32 values; column ids int32, or int64 for more than 2^31 - 1
    features) and int64 labels 0/1."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def matrix(self, columns: int) -> Any:
        from scipy.sparse import csr_matrix

        return csr_matrix((self.values, self.indices, self.indptr), shape=(len(self), columns))

    def rows(self, chosen: np.ndarray) -> SparseSplit:
        """The rows ``chosen`` (sorted or not), as a new split."""
        starts, ends = self.indptr[chosen], self.indptr[chosen + 1]
        lengths = ends - starts
        indptr = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        take = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])
        return SparseSplit(indptr, self.indices[take], self.values[take], self.labels[chosen])


TrueWeights = Callable[[np.ndarray], np.ndarray]
"""The true weight (float32) of each of some feature ids."""


def generate(spec: SyntheticSpec) -> tuple[SparseSplit, SparseSplit, TrueWeights]:
    """(train, test, the true weights as a function of feature ids)."""
    rng = np.random.default_rng(spec.seed)
    if spec.ids == "permuted":
        truth, splits = _permuted(rng, spec)
    else:
        truth = functools.partial(_hashed_weights, spec)
        splits = [_hashed_split(rng, spec, count, truth) for count in (spec.samples, spec.test)]
    margins = np.concatenate([m for _, m in splits])
    scale = spec.noise * float(margins.std() or 1.0)
    scores = [margins_ + rng.normal(0.0, scale, len(margins_)) for _, margins_ in splits]
    threshold = float(np.quantile(np.concatenate(scores), 1 - spec.ctr)) if spec.ctr else 0.0
    labelled = [dataclasses.replace(split, labels=(score > threshold).astype(np.int64))
                for (split, _), score in zip(splits, scores, strict=True)]
    return labelled[0], labelled[1], truth


Rows = tuple[SparseSplit, np.ndarray]  # a split (labels still 0) and its samples' true margins


def _permuted(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[TrueWeights, list[Rows]]:
    ranks = np.arange(1, spec.features + 1, dtype=np.float64) ** -spec.alpha
    cumulative = np.cumsum(ranks)
    cumulative /= cumulative[-1]
    ids = rng.permutation(spec.features).astype(np.int32)  # rank -> feature id
    dense = np.where(rng.random(spec.features) < spec.density,
                     rng.standard_normal(spec.features), 0.0).astype(np.float32)
    truth = functools.partial(np.take, dense)
    splits = []
    for count in (spec.samples, spec.test):
        drawn = ids[np.searchsorted(cumulative, rng.random((count, spec.nnz)))]
        splits.append(_split(*_distinct(drawn, truth)))
    return truth, splits


def _hashed_weights(spec: SyntheticSpec, ids: np.ndarray) -> np.ndarray:
    nonzero = unit_uniform(ids, spec.seed + 1) < spec.density
    return np.where(nonzero, unit_normal(ids, spec.seed + 2), 0.0).astype(np.float32)


# Hashed rows are made this many draws at a time, so that the sampler's and the hash's scratch
# arrays stay small (tens of MB) whatever the sample count. The data depend on it: keep it.
BLOCK_DRAWS = 1 << 20


def _hashed_split(rng: np.random.Generator, spec: SyntheticSpec, count: int,
                  truth: TrueWeights) -> Rows:
    per_block = max(1, BLOCK_DRAWS // spec.nnz)
    blocks = [_hashed_rows(rng, spec, min(per_block, count - start), truth)
              for start in range(0, count, per_block)]
    lengths, indices, margins = (np.concatenate(part) for part in zip(*blocks, strict=True))
    return _split(lengths, indices, margins)


def _hashed_rows(rng: np.random.Generator, spec: SyntheticSpec, count: int,
                 truth: TrueWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ranks = zipf_ranks(rng, count * spec.nnz, spec.alpha, spec.features)
    dtype = np.int32 if spec.features <= INT32_MAX else np.int64
    drawn = (mix64(ranks, spec.seed) % np.uint64(spec.features)).astype(dtype)
    return _distinct(drawn.reshape(count, spec.nnz), truth)


def _distinct(drawn: np.ndarray, truth: TrueWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row lengths, column ids, true margins) of rows of feature ids ``drawn``, one row per
    sample: each row's ids sorted, a feature drawn twice counted once."""
    drawn.sort(axis=1)
    keep = np.ones(drawn.shape, dtype=bool)
    keep[:, 1:] = drawn[:, 1:] != drawn[:, :-1]
    lengths = keep.sum(axis=1)
    indices = drawn[keep]
    starts = np.zeros(len(drawn), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    margins = (np.add.reduceat(truth(indices), starts) if len(indices)
               else np.zeros(len(drawn)))
    return lengths, indices, margins


def _split(lengths: np.ndarray, indices: np.ndarray, margins: np.ndarray) -> Rows:
    count = len(lengths)
    indptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    values = np.ones(len(indices), dtype=np.float32)
    return SparseSplit(indptr, indices, values, np.zeros(count, dtype=np.int64)), margins


# Rejection-inversion rounds before giving up: each rejects under 2 % of the draws (module
# docstring), so 64 rounds leave one pending with probability below 10^-100.
MAX_ROUNDS = 64
# Ranks above this are accepted untested: the share of rank k the test rejects, about
# alpha (alpha + 1) / (24 k^2), is below 10^-12 there, finer than float64 places x near k; the
# test would reject by rounding instead (where x's spacing nears a rank, 2^50 and up).
SURE_RANK = 2**20


def zipf_ranks(rng: np.random.Generator, count: int, alpha: float, n: int) -> np.ndarray:
    """``count`` draws (int64) of k in 1..``n`` with P(k) ∝ k^-``alpha``, ``alpha`` in (0, 3], by
    rejection-inversion (module docstring)."""
    law = _PowerLaw(alpha)
    top, first = law.integral(np.array([n + 0.5, 1.5]))
    bottom = first - 1.0  # rank 1's share, h(1) = 1, ends at H(1.5)
    ranks = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    for _ in range(MAX_ROUNDS):
        x = law.inverse(top + rng.random(len(pending)) * (bottom - top))
        k = np.clip(np.floor(x + 0.5), 1.0, float(n))
        accepted = (k > SURE_RANK) | (x >= law.lowest_accepted(k))
        ranks[pending[accepted]] = k[accepted]
        pending = pending[~accepted]
        if not len(pending):
            return ranks
    raise RuntimeError(f"rejection-inversion left {len(pending)} of {count} draws after "
                       f"{MAX_ROUNDS} rounds (alpha {alpha}, n {n})")


class _PowerLaw:
    """h(x) = x^-alpha, its integral H(x) = (x^(1-alpha) - 1)/(1 - alpha) (H(1) = 0; log x at
    alpha = 1) and H's inverse, in forms that stay accurate as 1 - alpha nears 0."""

    def __init__(self, alpha: float) -> None:
        self.alpha, self.rest = alpha, 1.0 - alpha

    def lowest_accepted(self, k: np.ndarray) -> np.ndarray:
        """H^-1(H(k + 1/2) - h(k)): rank k is accepted when x is at least this (the paper's test,
        u >= H(k + 1/2) - h(k), moved to x). Written as y (1 - (1 - alpha) t)^(1/(1 - alpha))
        with y = k + 1/2 and t = h(k) y^(alpha - 1), it takes no difference of H's values,
        which loses the digits the test needs once h(k) is small beside H(k)."""
        y = k + 0.5
        t = np.exp((self.alpha - 1.0) * np.log(y) - self.alpha * np.log(k))
        result: np.ndarray = y * np.exp(-t * _log1p_over(-self.rest * t))
        return result

    def integral(self, x: np.ndarray) -> np.ndarray:
        log_x = np.log(x)
        result: np.ndarray = log_x * _expm1_over(self.rest * log_x)
        return result

    def inverse(self, u: np.ndarray) -> np.ndarray:
        # (1 + (1 - alpha) u)^(1 / (1 - alpha)); rounding may take the base a hair below 0 at
        # the top of the range for alpha > 1, where x is then +inf and clipped to n.
        with np.errstate(divide="ignore", over="ignore"):
            result: np.ndarray = np.exp(u * _log1p_over(np.maximum(self.rest * u, -1.0)))
        return result


def _expm1_over(t: np.ndarray) -> np.ndarray:
    """expm1(t) / t, 1 at t = 0: H's factor, exact as t nears 0 (expm1 keeps its digits)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        result: np.ndarray = np.where(t == 0.0, 1.0, np.expm1(t) / t)
    return result


def _log1p_over(t: np.ndarray) -> np.ndarray:
    """log1p(t) / t, 1 at t = 0: H^-1's factor, likewise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        result: np.ndarray = np.where(t == 0.0, 1.0, np.log1p(t) / t)
    return result
