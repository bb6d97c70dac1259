"""Turning a named data set into normalised numpy arrays.

Normalisation: one scalar mean and one scalar standard deviation are taken over every pixel of
the (kept) training images, and both splits are mapped to ``(x - mean) / std`` as float32, so the
training set has mean 0 and std 1 and the test set is transformed identically. Scalar rather than
per-pixel statistics because MNIST's border pixels are always 0 and would divide by zero; scaling
to [0, 1] first would change nothing, as standardising undoes any affine scaling.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
from pathlib import Path

import numpy as np

from engine.datasets.dataset import Dataset
from engine.datasets.idx import read_idx
from engine.datasets.registry import DatasetSpec, get_spec
from engine.datasets.resolve import find_files
from engine.datasets.shared import key, recall, remember
from engine.datasets.sources import (
    check_source,
    generate_sparse,
    is_sparse_source,
    is_user_source,
    load_user_source,
    locate_user_source,
    sparse_spec,
)
from engine.errors import ConfigError, DataError, DatasetFormatError

# The digits split: a permutation from numpy.random.default_rng(DIGITS_SEED); its last
# DIGITS_TEST_FRACTION (rounded) is the test set, the rest, in permuted order, the training set.
DIGITS_SEED = 0
DIGITS_TEST_FRACTION = 0.2
SKLEARN_SOURCE = "sklearn"
GENERATED = "generated"  # a synthetic data set, made from its seed by each process
# The sparse data sets (sparse-synthetic and the hashed files, which are also user sources) are
# asked about first below: they are described and loaded as sparse rows, never as a user's arrays.


def locate(name: str, data_dir: Path | None = None, *, allow_download: bool = False) -> str:
    """Where :func:`load_dataset` would load ``name`` from, checked without decoding anything.

    Meant for a launcher to fail fast before it spawns processes. Files found are verified (size
    and md5); with ``allow_download`` missing files are fetched into the cache, so that workers
    started afterwards find them there.
    """
    if is_user_source(name):  # a hashed file is read and checked here
        return locate_user_source(name)
    if is_sparse_source(name):
        check_source(name)
        return GENERATED
    spec = get_spec(name)
    if spec.files is None:
        _require_sklearn()
        return SKLEARN_SOURCE
    return str(find_files(spec, data_dir, allow_download=allow_download))


def describe(name: str, data_dir: Path | None = None, *, train_limit: int | None = None,
             hash_features: int | None = None) -> DatasetSpec:
    """The spec of ``name``: the registry's for a named data set; a user's is loaded to learn
    its sample shape and classes; a hashed file's features are ``hash_features`` (the run's
    ``data.hash_features``)."""
    if is_sparse_source(name):
        return sparse_spec(name, hash_features=hash_features)
    if is_user_source(name):
        return load_user_source(name, train_limit=_check_limit(train_limit)).spec
    return get_spec(name)


def load_dataset(
    name: str,
    data_dir: Path | None = None,
    *,
    allow_download: bool = True,
    train_limit: int | None = None,
) -> Dataset:
    """Load, verify and normalise ``name``; ``train_limit`` keeps the first N training samples.
    In a role forked from the warm template, the template's copy (``preload``)."""
    kept = recall(key(name, data_dir, train_limit))
    if isinstance(kept, Dataset):
        return kept
    if is_sparse_source(name):
        raise ConfigError(f"{name} has sparse samples: they train --model logreg on the "
                          "local or ray backend (not the simulator)")
    if is_user_source(name):
        return load_user_source(name, train_limit=_check_limit(train_limit))
    spec = get_spec(name)
    limit = _check_limit(train_limit)
    if spec.files is None:
        source = SKLEARN_SOURCE
        train_x, train_y, test_x, test_y = _load_digits(limit)
    else:
        directory = find_files(spec, data_dir, allow_download=allow_download)
        source = str(directory)
        train_x, train_y, test_x, test_y = _load_idx(spec, directory, limit)
    _check_features(spec, train_x, test_x)
    train_x, test_x, mean, std = _standardise(train_x, test_x)
    shape = spec.sample_shape
    return Dataset(
        spec=spec,
        train_x=train_x.reshape(len(train_x), *shape),
        train_y=train_y,
        test_x=test_x.reshape(len(test_x), *shape),
        test_y=test_y,
        source=source,
        pixel_mean=mean,
        pixel_std=std,
    )


def preload(name: str, data_dir: Path | None, train_limit: int | None,
            hash_features: int | None = None) -> bool:
    """Load ``name`` into this process for the processes it will fork (the warm template);
    whether it did. A user's data set is not: loading it runs the user's code, which belongs in
    the roles (where its errors are reported). A hashed sparse file runs none: it is read here,
    into ``hash_features`` ids."""
    if is_sparse_source(name):
        remember(key(name, None, train_limit, hash_features),
                 generate_sparse(name, train_limit, hash_features))
        return True
    if is_user_source(name):
        return False
    remember(key(name, data_dir, train_limit),
                    load_dataset(name, data_dir, allow_download=False, train_limit=train_limit))
    return True


def _check_limit(train_limit: int | None) -> int | None:
    if train_limit is None:
        return None
    if isinstance(train_limit, bool) or not isinstance(train_limit, int) or train_limit < 1:
        raise ConfigError(f"train_limit must be a positive integer, got {train_limit!r}")
    return train_limit


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _load_idx(spec: DatasetSpec, directory: Path, limit: int | None) -> Arrays:
    assert spec.files is not None
    files = spec.files
    train_x = _images(directory / files.train_images.name, limit)
    train_y = _labels(directory / files.train_labels.name, spec, limit)
    test_x = _images(directory / files.test_images.name, None)
    test_y = _labels(directory / files.test_labels.name, spec, None)
    _check_counts(directory / files.train_labels.name, train_x, train_y)
    _check_counts(directory / files.test_labels.name, test_x, test_y)
    return train_x, train_y, test_x, test_y


def _images(path: Path, limit: int | None) -> np.ndarray:
    images = read_idx(path, max_items=limit)
    if images.dtype != np.uint8 or images.ndim < 2:
        raise DatasetFormatError(
            f"{path}: expected uint8 images of 2 or more dimensions, got {images.dtype} "
            f"with shape {images.shape}"
        )
    return images.reshape(len(images), -1)


def _labels(path: Path, spec: DatasetSpec, limit: int | None) -> np.ndarray:
    labels = read_idx(path, max_items=limit)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DatasetFormatError(
            f"{path}: expected a 1-d integer label vector, got {labels.dtype} {labels.shape}"
        )
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise DatasetFormatError(
            f"{path}: labels range over {labels.min()}..{labels.max()}, but {spec.name} has "
            f"classes 0..{spec.num_classes - 1}"
        )
    return labels


def _check_counts(label_path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    if len(images) != len(labels):
        raise DatasetFormatError(
            f"{label_path}: {len(labels)} labels for {len(images)} images; the files do not "
            "belong together"
        )


def _check_features(spec: DatasetSpec, *splits: np.ndarray) -> None:
    for split in splits:
        if split.shape[1] != spec.input_dim:
            raise DatasetFormatError(
                f"{spec.name}: samples have {split.shape[1]} values, expected {spec.input_dim}"
            )


def _load_digits(limit: int | None) -> Arrays:
    _require_sklearn()
    data = _digits_table()
    x = np.asarray(data[:, :-1], dtype=np.float64)
    y = np.asarray(data[:, -1], dtype=np.int64)
    order = np.random.default_rng(DIGITS_SEED).permutation(len(y))
    n_test = round(len(y) * DIGITS_TEST_FRACTION)
    train, test = order[: len(y) - n_test], order[len(y) - n_test :]
    train = train[:limit]
    return x[train], y[train], x[test], y[test]


def _digits_table() -> np.ndarray:
    """scikit-learn's digits as one (1797, 65) table, the label last.

    Read straight from the CSV file scikit-learn ships, as its ``load_digits`` reads it:
    importing scikit-learn takes over a second, paid by every worker and evaluator of a digits
    run. A scikit-learn laid out differently is asked through its own function."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    csv = Path(folders[0], "datasets", "data", "digits.csv.gz") if folders else None
    try:
        if csv is not None and csv.is_file():
            with gzip.open(csv, mode="rt", encoding="utf-8") as text:
                return np.loadtxt(text, delimiter=",")
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        return np.column_stack([x, y])
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"scikit-learn could not load its digits data: {exc}") from exc


def _require_sklearn() -> None:
    if importlib.util.find_spec("sklearn") is None:
        raise DataError(
            "the digits data set comes with scikit-learn, which is not installed: "
            "pip install scikit-learn"
        )


def _standardise(
    train_x: np.ndarray, test_x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Both splits mapped with the training set's mean and std (1 if constant: no division by 0)."""
    mean = float(train_x.mean(dtype=np.float64)) if train_x.size else 0.0
    train = _normalise(train_x, mean, 1.0)
    # Per-row float32 dot products summed in float64: as fast as BLAS (7 ms for MNIST) and within
    # 1e-6 of the exact value; one float32 dot over all 47M values is off by 1e-4.
    squares = float(np.einsum("ij,ij->i", train, train).sum(dtype=np.float64))
    std = math.sqrt(squares / train.size) if train.size else 0.0
    std = std if std > 0 else 1.0
    train *= np.float32(1.0 / std)
    return train, _normalise(test_x, mean, std), mean, std


def _normalise(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    # One float32 buffer written by in-place ufuncs: astype followed by arithmetic would allocate
    # a further 188 MB temporary per step for MNIST's training set.
    out = np.empty(x.shape, dtype=np.float32)
    np.subtract(x, np.float32(mean), out=out, dtype=np.float32)
    out *= np.float32(1.0 / std)
    return out
