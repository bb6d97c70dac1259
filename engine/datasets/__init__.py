"""Data sets for psctl runs: ``mnist``, ``fashion-mnist`` and ``digits``.

Only numpy, platformdirs and the standard library are imported here, never torch, because the
CLI imports this package to validate ``--dataset`` and must start fast. See docs/datasets.md for
where files are looked for, how they are verified and how inputs are normalised.
"""

from __future__ import annotations

from engine.datasets.dataset import Dataset
from engine.datasets.loader import describe, load_dataset, locate
from engine.datasets.registry import DatasetSpec, FileSpec, IdxFiles, dataset_names, get_spec
from engine.datasets.resolve import ENV_VAR, cache_root

__all__ = [
    "ENV_VAR",
    "Dataset",
    "DatasetSpec",
    "FileSpec",
    "IdxFiles",
    "cache_root",
    "dataset_names",
    "describe",
    "get_spec",
    "load_dataset",
    "locate",
]
