"""Data sets loaded once in the warm template and shared, copy-on-write, by the roles it forks.

The template (``engine.roles.template``) loads the run's data set before it forks any worker or
the evaluator; each of them then finds the arrays here instead of reading and normalising the
files again, and their pages stay shared across every process of the run (a forked worker adds
its own shard and model, not another copy of the data set). The arrays are made read-only: a
write would silently copy the pages it touches into that one process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The data set's name, folder, training limit and the space a hashed file's ids are in.
Key = tuple[str, str | None, int | None, int | None]

_LOADED: dict[Key, Any] = {}


def key(name: str, data_dir: object, train_limit: int | None,
        hash_features: int | None = None) -> Key:
    return name, None if data_dir is None else str(data_dir), train_limit, hash_features


def remember(at: Key, data: Any) -> None:
    """Keep ``data`` (a Dataset or SparseDataset) for the processes forked from this one."""
    for value in vars(data).values():
        _read_only(value)
    _LOADED[at] = data


def recall(at: Key) -> Any | None:
    return _LOADED.get(at)


def _read_only(value: object) -> None:
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
        return
    if hasattr(value, "__dict__"):  # a sparse split: its index and value arrays
        for inner in vars(value).values():
            if isinstance(inner, np.ndarray):
                inner.setflags(write=False)
