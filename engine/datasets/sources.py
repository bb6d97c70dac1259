"""Data sets a user brings: ``path/to/file.py:load``, ``libsvm:PATH``, and the sparse
``libsvm-hashed:PATH`` and ``criteo:PATH`` (``engine.datasets.hashed``).

A loader file defines ``load() -> (train_x, train_y, test_x, test_y)``: numpy arrays (or anything
``numpy.asarray`` takes), inputs of any sample shape, labels integers 0..K-1. Its arrays are used
as given (cast to float32, never normalised: the loader knows its data). ``libsvm:PATH`` reads an
svmlight/libsvm text file with scikit-learn; ``PATH.t`` beside it, as LIBSVM's own data sets ship,
is the test set, otherwise a seeded fifth of the file is held out. Labels of either kind of file
are mapped, in sorted order, to 0..K-1 (libsvm's -1/+1 become 0/1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import engine.datasets.hashed as hashed
from engine.datasets.dataset import Dataset
from engine.datasets.registry import DatasetSpec
from engine.datasets.shared import key, recall
from engine.datasets.sparse import (
    PREFIX,
    SparseSplit,
    canonical,
    generate,
    is_sparse_synthetic,
    parse,
)
from engine.errors import ConfigError, DataError, DatasetFormatError
from engine.userfiles import parse_file_ref

LIBSVM = "libsvm:"
HOLDOUT_SEED = 0
HOLDOUT_FRACTION = 0.2
# A libsvm file's inputs are made dense float32 in every process that loads it (the workers, the
# evaluator, the coordinator): beyond this they are refused with the size they would take, before
# any process starts. MNIST's 70,000 x 784 inputs take 209 MiB.
MAX_DENSE_BYTES = 256 << 20


def is_user_source(text: str) -> bool:
    """Whether ``text`` names files of the user's: no folder of psctl's to pin, nothing to
    download. The hashed sparse files are among them (``is_sparse_source`` says which are
    sparse)."""
    name = text.strip()
    if name.startswith(LIBSVM) or hashed.is_hashed(name):
        return True
    return name.rpartition(":")[0].endswith(".py") or name.endswith(".py")


def is_sparse_source(text: str) -> bool:
    """Whether ``text`` names a data set of sparse rows (``SparseDataset``): the one question
    every part that trains, plans or checks a run asks of its data set."""
    return is_sparse_synthetic(text) or hashed.is_hashed(text)


def label(text: str) -> str:
    """A short name for run names and tables: the file's stem for a user data set."""
    name = text.strip()
    if name.startswith(LIBSVM) or hashed.is_hashed(name):
        return Path(name.partition(":")[2]).name
    if is_user_source(name):
        return Path(name.rpartition(":")[0] if ":" in name else name).stem
    return PREFIX if is_sparse_synthetic(name) else name


def check_source(text: str) -> str:
    """A ``--dataset`` value made canonical: user files get absolute paths (and must exist), a
    synthetic data set every parameter."""
    name = text.strip()
    if is_sparse_synthetic(name):
        return canonical(parse(name))
    if hashed.is_hashed(name):
        return hashed.canonical(name)
    if name.startswith(LIBSVM):
        return LIBSVM + str(_libsvm_path(name))
    ref = parse_file_ref(name, what="dataset", default_function="load")
    return name if ref is None else str(ref)


def locate_user_source(text: str) -> str:
    """Where a user data set comes from, checked to exist; a libsvm file (plain or hashed) or
    a Criteo log is also read (kept sparse) and checked as its loading will, so that a bad one
    fails before any process starts."""
    name = check_source(text)
    if hashed.is_hashed(name):
        hashed.read(name)
        return str(hashed.file_path(name))
    if name.startswith(LIBSVM):
        _read_libsvm(Path(name.removeprefix(LIBSVM)))
    return name.removeprefix(LIBSVM)


def load_user_source(text: str, *, train_limit: int | None = None) -> Dataset:
    name = check_source(text)
    if name.startswith(LIBSVM):
        path = Path(name.removeprefix(LIBSVM))
        arrays, source = _load_libsvm(path), str(path)
    else:
        arrays, source = _call_loader(name), name.rpartition(":")[0]
    train_x, train_y, test_x, test_y = arrays
    train_x, train_y = train_x[:train_limit], train_y[:train_limit]
    shape = tuple(int(n) for n in train_x.shape[1:])
    spec = DatasetSpec(name=name, description=f"user data set {name}",
                       input_dim=math.prod(shape), num_classes=int(max(train_y.max(),
                                                                       test_y.max())) + 1,
                       input_shape=shape)
    return Dataset(spec=spec, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                   source=source)


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _call_loader(name: str) -> Arrays:
    from engine.userfiles import call_user_function

    result = call_user_function(name, what="dataset")
    if not isinstance(result, tuple | list) or len(result) != 4:
        raise DatasetFormatError(f"dataset {name}: load() must return (train_x, train_y, "
                                 f"test_x, test_y), got {type(result).__name__}")
    train_x, test_x = (_inputs(name, part, value) for part, value in
                       (("train_x", result[0]), ("test_x", result[2])))
    train_y, test_y = _integer_labels(name, result[1], result[3])
    _check_split(name, "train", train_x, train_y)
    _check_split(name, "test", test_x, test_y)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DatasetFormatError(f"dataset {name}: train samples have shape "
                                 f"{train_x.shape[1:]}, test samples {test_x.shape[1:]}")
    return train_x, train_y, test_x, test_y


def _inputs(name: str, part: str, value: Any) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DatasetFormatError(f"dataset {name}: {part} is not an array: {exc}") from exc
    if array.ndim < 2 or array.dtype.kind not in "biuf":
        raise DatasetFormatError(f"dataset {name}: {part} must be numbers of shape (N, ...), "
                                 f"got {array.dtype} {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise DatasetFormatError(f"dataset {name}: {part} holds NaN or infinite values")
    return array


def _integer_labels(name: str, *parts: Any) -> tuple[np.ndarray, np.ndarray]:
    arrays = [np.asarray(part) for part in parts]
    for array in arrays:
        if array.ndim != 1 or array.dtype.kind not in "iu" or (array.size and array.min() < 0):
            raise DatasetFormatError(f"dataset {name}: labels must be a 1-d array of integers "
                                     f"0..K-1, got {array.dtype} {array.shape}")
    train, test = (array.astype(np.int64) for array in arrays)
    return train, test


def _check_split(name: str, part: str, inputs: np.ndarray, labels: np.ndarray) -> None:
    if len(inputs) != len(labels) or not len(labels):
        raise DatasetFormatError(f"dataset {name}: {len(inputs)} {part} samples and "
                                 f"{len(labels)} labels (they must match and not be empty)")


def _libsvm_path(name: str) -> Path:
    path = Path(name.removeprefix(LIBSVM)).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"dataset {name!r}: {path} is not a file")
    return path


def _load_libsvm(path: Path) -> Arrays:
    train_x, train_y, test_x, test_y = _read_libsvm(path)
    features = max(train_x.shape[1], test_x.shape[1])
    labels = np.unique(np.concatenate([train_y, test_y]))
    return (_dense(train_x, features), np.searchsorted(labels, train_y).astype(np.int64),
            _dense(test_x, features), np.searchsorted(labels, test_y).astype(np.int64))


def _read_libsvm(path: Path) -> tuple[Any, np.ndarray, Any, np.ndarray]:
    """The file's (train inputs, labels, test inputs, labels), inputs still sparse, refused in
    one line naming the file when it cannot be trained on as dense float32 inputs."""
    try:
        from sklearn.datasets import load_svmlight_file, load_svmlight_files
    except ImportError as exc:
        raise DataError("libsvm files are read by scikit-learn: pip install scikit-learn") \
            from exc
    test_path = path.with_name(path.name + ".t")
    try:
        if test_path.is_file():
            train_x, train_y, test_x, test_y = load_svmlight_files([str(path), str(test_path)])
        else:
            x, y = load_svmlight_file(str(path))
            _check_samples(path, x.shape[0], 2, " (one to train on, one to test)")
            order = np.random.default_rng(HOLDOUT_SEED).permutation(x.shape[0])
            cut = x.shape[0] - max(1, round(x.shape[0] * HOLDOUT_FRACTION))
            train_x, train_y, test_x, test_y = x[order[:cut]], y[order[:cut]], \
                x[order[cut:]], y[order[cut:]]
    except (OSError, ValueError) as exc:
        raise DatasetFormatError(f"{path}: not a readable libsvm file: {_one_line(exc)}") \
            from None
    except OverflowError:  # a feature index or a label past what a C long holds
        raise DatasetFormatError(f"{path}: not a readable libsvm file: a feature index or "
                                 "label is above 2^63") from None
    _check_samples(path, train_x.shape[0], 1, "")
    _check_samples(test_path, test_x.shape[0], 1, "")
    for inputs, labels in ((train_x, train_y), (test_x, test_y)):
        if not (np.isfinite(inputs.data).all() and np.isfinite(labels).all()):
            where = test_path if inputs is test_x and test_path.is_file() else path
            raise DatasetFormatError(f"{where}: holds NaN or infinite features or labels")
    _check_dense_size(path, train_x.shape[0] + test_x.shape[0],
                      max(train_x.shape[1], test_x.shape[1]))
    return train_x, train_y, test_x, test_y


def _check_samples(path: Path, count: int, least: int, why: str) -> None:
    if count < least:
        raise DatasetFormatError(f"{path}: {count} sample{'' if count == 1 else 's'}; a "
                                 f"libsvm data set needs at least {least}{why}")


def _check_dense_size(path: Path, samples: int, features: int) -> None:
    needed = samples * features * 4
    if needed > MAX_DENSE_BYTES:
        raise DatasetFormatError(
            f"{path}: {samples} samples x {features} features would take {_size(needed)} as "
            f"the dense float32 inputs every process loads (limit {_size(MAX_DENSE_BYTES)}); "
            "is a feature index wrong?")


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "…"


def _dense(matrix: Any, features: int) -> np.ndarray:
    dense = np.zeros((matrix.shape[0], features), dtype=np.float32)
    dense[:, :matrix.shape[1]] = matrix.toarray()
    return dense


@dataclass(frozen=True, eq=False)
class SparseDataset:
    """A data set of sparse rows (``engine.datasets.sparse``)."""

    spec: DatasetSpec
    train: SparseSplit
    test: SparseSplit
    source: str


def sparse_spec(text: str, *, hash_features: int | None = None) -> DatasetSpec:
    """The spec of the sparse data set ``text`` names; a hashed file's is not read for it. A
    hashed file's features are hashed into ``hash_features`` ids (the run's
    ``data.hash_features``; None: ``hashed.FEATURES``)."""
    if hashed.is_hashed(text):
        features = hashed_space(hash_features)
        return DatasetSpec(name=hashed.canonical(text),
                           description=hashed.description(text, features),
                           input_dim=features, num_classes=2, input_shape=(features,),
                           sparse=True)
    synthetic = parse(text)
    return DatasetSpec(name=canonical(synthetic), description="synthetic sparse data, power-law "
                       "feature frequencies", input_dim=synthetic.features, num_classes=2,
                       input_shape=(synthetic.features,), sparse=True)


def hashed_space(hash_features: int | None) -> int:
    """The ids a hashed file's features are hashed into: the run's ``data.hash_features``, or
    the default where it gives none (a run stored before it was a setting)."""
    return hashed.FEATURES if hash_features is None else hash_features


def load_sparse(text: str, *, train_limit: int | None = None,
                hash_features: int | None = None) -> SparseDataset:
    """The sparse data set ``text`` names, generated from its seed or read from its file (its
    features hashed into ``hash_features`` ids, as ``sparse_spec`` says)."""
    if not is_sparse_source(text):
        raise ConfigError(f"{text!r} is not a sparse data set (sparse-synthetic:..., "
                          "libsvm-hashed:PATH or criteo:PATH)")
    kept = recall(key(text, None, train_limit, hash_features))
    if isinstance(kept, SparseDataset):  # generated once, in the warm template
        return kept
    return generate_sparse(text, train_limit, hash_features)


def generate_sparse(text: str, train_limit: int | None,
                    hash_features: int | None = None) -> SparseDataset:
    """The sparse data set ``text`` names, made (or read) in this process."""
    if hashed.is_hashed(text):
        train, test = hashed.read(text, hashed_space(hash_features))
        source = str(hashed.file_path(text))
    else:
        train, test, _ = generate(parse(text))
        source = "generated"
    if train_limit is not None and train_limit < len(train):
        train = train.rows(np.arange(train_limit))
    return SparseDataset(sparse_spec(text, hash_features=hash_features), train, test, source)
