"""``sparse-synthetic:features=1000000,nnz=50``: the sparse logistic-regression workload of seed 003
(OSDI'14), made here because its ad-click data is not public.

Every sample has about ``nnz`` features of value 1, drawn with power-law frequencies (the k-th
most frequent feature with probability proportional to k^-``alpha``, so a few features appear in
most samples and most in almost none), and the feature ids are shuffled, so that frequent keys
spread over every server's range. A known weight vector is nonzero on a ``density`` share of the
features, normal; a sample's label is 1 when its margin plus Gaussian noise (``noise`` times the
margins' standard deviation) is positive. Every process that loads it makes the same arrays from
``seed``: nothing is written to disk.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ConfigError

PREFIX = "sparse-synthetic"


@dataclass(frozen=True)
class SyntheticSpec:
    features: int = 1_000_000
    nnz: int = 50
    samples: int = 100_000
    test: int = 10_000
    alpha: float = 1.0
    density: float = 0.1
    noise: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.features <= 2**31 - 1:
            raise ConfigError(f"{PREFIX}: features must be 2..2^31-1, got {self.features}")
        if not 1 <= self.nnz <= min(self.features, 10_000):
            raise ConfigError(f"{PREFIX}: nnz must be 1..min(features, 10000), got {self.nnz}")
        if not 1 <= self.samples <= 10_000_000 or not 1 <= self.test <= 10_000_000:
            raise ConfigError(f"{PREFIX}: samples and test must be 1..10^7")
        if not 0 < self.alpha <= 3 or not 0 < self.density <= 1 or not 0 <= self.noise <= 10:
            raise ConfigError(f"{PREFIX}: alpha must be in (0, 3], density in (0, 1], noise in "
                              "[0, 10]")


def is_sparse_synthetic(text: str) -> bool:
    return text.strip().split(":", 1)[0] == PREFIX


def parse(text: str) -> SyntheticSpec:
    """``sparse-synthetic[:key=value,...]``; the keys are SyntheticSpec's fields."""
    _, _, tail = text.strip().partition(":")
    fields = {f.name: f.type for f in dataclasses.fields(SyntheticSpec)}
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in tail.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise ConfigError(f"{PREFIX}: {item!r} is not KEY=VALUE with KEY one of "
                              f"{', '.join(fields)}")
        try:
            values[key] = float(value) if fields[key] == "float" else int(value.replace("_", ""))
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}: {key}={value!r} is not a number") from exc
    return SyntheticSpec(**values)


def canonical(spec: SyntheticSpec) -> str:
    """The spec written out in full, so that a stored run says exactly which data it had."""
    return PREFIX + ":" + ",".join(f"{f.name}={getattr(spec, f.name)!r}"
                                   for f in dataclasses.fields(spec))


@dataclass(frozen=True, eq=False)
class SparseSplit:
    """Rows of a CSR matrix (float32 values, int32 column ids) and int64 labels 0/1."""

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


def generate(spec: SyntheticSpec) -> tuple[SparseSplit, SparseSplit, np.ndarray]:
    """(train, test, the true weights)."""
    rng = np.random.default_rng(spec.seed)
    ranks = np.arange(1, spec.features + 1, dtype=np.float64) ** -spec.alpha
    cumulative = np.cumsum(ranks)
    cumulative /= cumulative[-1]
    ids = rng.permutation(spec.features).astype(np.int32)  # rank -> feature id
    truth = np.where(rng.random(spec.features) < spec.density,
                     rng.standard_normal(spec.features), 0.0).astype(np.float32)
    splits = [_split(rng, spec, count, cumulative, ids, truth)
              for count in (spec.samples, spec.test)]
    margins = np.concatenate([m for _, m in splits])
    scale = spec.noise * float(margins.std() or 1.0)
    labelled = [_labelled(split, margins_, rng, scale) for split, margins_ in splits]
    return labelled[0], labelled[1], truth


def _split(rng: np.random.Generator, spec: SyntheticSpec, count: int, cumulative: np.ndarray,
           ids: np.ndarray, truth: np.ndarray) -> tuple[SparseSplit, np.ndarray]:
    drawn = ids[np.searchsorted(cumulative, rng.random((count, spec.nnz)))]
    drawn.sort(axis=1)
    keep = np.ones(drawn.shape, dtype=bool)
    keep[:, 1:] = drawn[:, 1:] != drawn[:, :-1]  # a feature drawn twice counts once
    indptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=indptr[1:])
    indices = drawn[keep]
    values = np.ones(len(indices), dtype=np.float32)
    margins = np.add.reduceat(truth[indices], indptr[:-1]) if len(indices) else np.zeros(count)
    return SparseSplit(indptr, indices, values, np.zeros(count, dtype=np.int64)), margins


def _labelled(split: SparseSplit, margins: np.ndarray, rng: np.random.Generator,
              scale: float) -> SparseSplit:
    labels = (margins + rng.normal(0.0, scale, len(margins)) > 0).astype(np.int64)
    return dataclasses.replace(split, labels=labels)
