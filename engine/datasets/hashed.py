"""Real sparse data sets read from files, their features hashed into the run's
``data.hash_features`` ids (``FEATURES``, 2^30, unless it gives another; issue 44):
``libsvm-hashed:PATH`` and ``criteo:PATH``. They train ``--model logreg`` and ``--model
embedding`` as ``sparse-synthetic`` does: the same ``SparseSplit`` rows, worker loop and
evaluator.

Every feature becomes the id ``mix64(key, SEED) % features`` (``engine.hashing``: SplitMix64's
finaliser), the hashing trick of ``engine.datasets.sparse``'s hashed ids. Two features of a row
that land on one id are one feature whose value is their sum, as colliding features sum in a
column of scikit-learn's ``FeatureHasher``. Nothing of the size of the hashed space is made.

- ``libsvm-hashed:PATH``: an svmlight/libsvm text file, ``label index:value ...``, its indices
  taken as written (0 is a feature; any of 0..2^64-1). The key of index i is i itself; values
  are kept (float32). Labels are binary: -1/+1 or 0/1, mapped to 0/1.
- ``criteo:PATH``: a Criteo click log, tab-separated: the label (0/1), 13 integer fields, 26
  categorical fields (hexadecimal strings); any field but the label may be empty, and an empty
  field is no feature. Every feature is a (field, value) pair keyed ``(field << 32) | value``,
  so that no two fields share a key: categorical field j (0..25) keys its value's low 32 bits
  (Criteo's values are 32-bit hashes already, 8 hexadecimal digits); integer field j (0..12) is
  field 26 + j, keyed by the bucket of its value n: n itself for n <= 2 (a negative n, as 32-bit
  two's complement, is then a bucket of its own), else floor(ln(n)^2). That is the transform of
  the winners of Criteo's 2014 Kaggle display-advertising contest (Juan, Zhuang, Chin and Lin,
  "3 Idiots", field-aware factorization machines). Every feature's value is 1.

``PATH.t`` beside the file, as LIBSVM's data sets ship, is the test split; without one the last
``TEST_FRACTION`` of the file's rows are (in file order: a click log's last rows are its latest).

The hashed space, ``features``, is a setting of the run (``data.hash_features``, ``--hash-features
2^24``), not part of the spec: a path may hold any character, so a suffix such as
``,features=...`` could not be told from a file name. It may be any whole number from 2 to 2^62
(as sparse-synthetic's ``features``: a key space holds no more). The default, 2^30, keeps column
ids int32 and collisions rare (about n^2 / 2^31 among n distinct features); a smaller space makes
a smaller model with more collisions, and past 2^31 - 1 column ids are int64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from engine.datasets.sparse import INT32_MAX, MAX_FEATURES, SparseSplit, is_sparse_synthetic
from engine.errors import ConfigError, DataError, DatasetFormatError
from engine.hashing import mix64

if TYPE_CHECKING:
    from engine.config import RunConfig

LIBSVM_HASHED = "libsvm-hashed"
CRITEO = "criteo"
PREFIXES = (LIBSVM_HASHED, CRITEO)
FEATURES = 2**30  # the hashed space of a run that gives none
# What a hashed file implies unless the run gives it (engine.plan): the space written out, so
# that a stored run says which ids its features were hashed into.
IMPLIES = {"data.hash_features": FEATURES}
SEED = 0
TEST_FRACTION = 0.1
# A file of more rows is refused: every process that trains on it holds all of its rows.
MAX_ROWS = 10**7
# A row of more features, or a line of more characters, is refused before it is split: one
# line of 16.5 MB (1.5 million features) cost 370 MB in every process that loaded it. Real rows
# hold tens to thousands (Criteo's 39, url's 414, news20's 16,000 at most).
MAX_ROW_FEATURES = 2**16
MAX_LINE_CHARS = 2**22  # 64 characters a feature
CRITEO_INTEGERS, CRITEO_CATEGORIES = 13, 26
CRITEO_FIELDS = 1 + CRITEO_INTEGERS + CRITEO_CATEGORIES
# Rows are hashed this many at a time (``_blocks``).
BLOCK_ROWS = 1 << 16
_LOW32 = 0xFFFFFFFF


def is_hashed(text: str) -> bool:
    """Whether ``text`` names a hashed file: ``libsvm-hashed:...`` or ``criteo:...``."""
    return prefix(text) in PREFIXES


def prefix(text: str) -> str:
    return text.strip().split(":", 1)[0]


def file_path(text: str) -> Path:
    """The data set's file, made absolute; a ConfigError when there is none."""
    name = text.strip()
    if not name.partition(":")[2].strip():
        raise ConfigError(f"dataset {name!r}: name the file, {prefix(name)}:PATH")
    path = Path(name.partition(":")[2]).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"dataset {name!r}: {path} is not a file")
    return path


def canonical(text: str) -> str:
    """``PREFIX:/absolute/path``: what a stored run names."""
    return f"{prefix(text)}:{file_path(text)}"


def description(text: str, features: int = FEATURES) -> str:
    kind = "libsvm file" if prefix(text) == LIBSVM_HASHED else "Criteo click log"
    return f"{kind} {file_path(text)}, features hashed into {written(features)} ids"


def written(features: int) -> str:
    """``2^24`` for a power of two, else the number with thousands separators."""
    power = features.bit_length() - 1
    return f"2^{power}" if features == 1 << power else f"{features:,}"


def hash_features_fit(run: RunConfig) -> None:
    """A rule of every run (engine.plan): data.hash_features is given only for a hashed file,
    where it means something; ValueError otherwise."""
    dataset = run.data.dataset
    if run.data.hash_features is None or is_hashed(dataset):
        return
    own = (" (sparse-synthetic sizes its own: sparse-synthetic:features=N)"
           if is_sparse_synthetic(dataset) else "")
    raise ValueError(f"data.hash_features (--hash-features) is the number of ids "
                     f"libsvm-hashed:PATH and criteo:PATH hash their features into; data set "
                     f"{prefix(dataset)} is neither{own}")


def read(text: str, features: int = FEATURES) -> tuple[SparseSplit, SparseSplit]:
    """(train, test) of the data set ``text`` names, its features hashed into ``features``
    ids: both files read line by line in Python (about 0.6 s per 10^6 features here), the keys
    hashed a block at a time."""
    if isinstance(features, bool) or not isinstance(features, int) or not (
            2 <= features <= MAX_FEATURES):
        raise ConfigError(f"dataset {text.strip()!r}: features are hashed into 2..2^62 ids, "
                          f"not {features!r}")
    path = file_path(text)
    parse_row = _libsvm_row if prefix(text) == LIBSVM_HASHED else _criteo_row
    return _read_file(path, parse_row, features)


def hashed_ids(keys: np.ndarray, features: int = FEATURES) -> np.ndarray:
    """The feature id of each key (any integer dtype) in a space of ``features``: int32, or
    int64 past 2^31 - 1 features (as sparse-synthetic's column ids)."""
    return (mix64(keys, SEED) % np.uint64(features)).astype(_id_dtype(features))


def _id_dtype(features: int) -> type[np.signedinteger]:
    return np.int32 if features <= INT32_MAX else np.int64


def _rows(indptr: np.ndarray, ids: np.ndarray, values: np.ndarray, labels: np.ndarray,
          features: int) -> SparseSplit:
    """A split whose rows have each id once, sorted, colliding features' values summed."""
    from scipy.sparse import csr_matrix

    matrix = csr_matrix((values.astype(np.float32), ids, indptr),
                        shape=(len(labels), features))
    matrix.sum_duplicates()  # sorts each row's ids, summing the values of a repeated one
    return SparseSplit(matrix.indptr.astype(np.int64), matrix.indices.astype(_id_dtype(features)),
                       matrix.data.astype(np.float32), labels.astype(np.int64))


def _split_tail(path: Path, split: SparseSplit) -> tuple[SparseSplit, SparseSplit]:
    """(all but the last TEST_FRACTION of the rows, those rows)."""
    count = len(split)
    if count < 2:
        raise DatasetFormatError(f"{path}: {count} sample{'' if count == 1 else 's'}; a data "
                                 "set without a .t file needs at least 2 (one to train on, one "
                                 "to test)")
    cut = count - max(1, round(count * TEST_FRACTION))
    return split.rows(np.arange(cut)), split.rows(np.arange(cut, count))


def _test_path(path: Path) -> Path:
    return path.with_name(path.name + ".t")


def _check_rows(path: Path, count: int) -> None:
    if count > MAX_ROWS:
        raise DatasetFormatError(f"{path}: more than {MAX_ROWS} rows; a hashed data set holds "
                                 "every row in each process that trains on it")
    if count < 1:
        raise DatasetFormatError(f"{path}: no samples")


# Reading a file: its rows' labels, feature counts, keys and values, BLOCK_ROWS rows at a time,
# so that a large file's keys are never all held as Python numbers at once.
Block = tuple[list[float], list[int], list[int], list[float]]
Row = tuple[float, list[int], list[float]]  # a line's label, keys and values
RowParser = Callable[[Path, int, str], Row | None]  # None: a line that holds no row


def _read_file(path: Path, parse_row: RowParser,
               features: int) -> tuple[SparseSplit, SparseSplit]:
    test_path = _test_path(path)
    if test_path.is_file():
        train, test = (_file_split(part, parse_row, features) for part in (path, test_path))
        return train, test
    return _split_tail(path, _file_split(path, parse_row, features))


def _file_split(path: Path, parse_row: RowParser, features: int) -> SparseSplit:
    labels: list[float] = []
    lengths: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for block in _blocks(path, parse_row):
        labels += block[0]
        lengths.append(np.array(block[1], dtype=np.int64))
        ids.append(hashed_ids(np.array(block[2], dtype=np.uint64), features))
        values.append(np.array(block[3], dtype=np.float32))
    _check_rows(path, len(labels))
    indptr = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lengths), out=indptr[1:])
    return _rows(indptr, np.concatenate(ids), np.concatenate(values),
                 _binary_labels(path, np.array(labels, dtype=np.float64)), features)


def _blocks(path: Path, parse_row: RowParser) -> Iterator[Block]:
    """The file's rows, BLOCK_ROWS at a time; a DatasetFormatError naming the file and line
    for a malformed one, or past MAX_ROWS rows."""
    block: Block = ([], [], [], [])
    count = 0
    try:
        with path.open(encoding="ascii", newline="") as lines:
            for number, line in enumerate(_bounded_lines(lines), start=1):
                row = parse_row(path, number, _within_bound(path, number, line))
                if row is None:
                    continue
                count += 1
                if count > MAX_ROWS:
                    _check_rows(path, count)
                block[0].append(row[0])
                block[1].append(len(row[1]))
                block[2].extend(row[1])
                block[3].extend(row[2])
                if len(block[0]) == BLOCK_ROWS:
                    yield block
                    block = ([], [], [], [])
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{path}: not a text file (byte {exc.start} of a line is not "
                                 "ASCII)") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read: {exc}") from None
    yield block


def _bounded_lines(lines: TextIO) -> Iterator[str]:
    """Each line, read up to two characters past MAX_LINE_CHARS (a longer one is cut there:
    ``_within_bound`` refuses it), so that no line is held whole however long it is."""
    while line := lines.readline(MAX_LINE_CHARS + 2):
        yield line


def _within_bound(path: Path, number: int, line: str) -> str:
    """The line without its end, or a DatasetFormatError if it is longer than MAX_LINE_CHARS."""
    text = line.rstrip("\r\n")
    if len(text) > MAX_LINE_CHARS:
        raise DatasetFormatError(f"{path}, line {number}: longer than {MAX_LINE_CHARS:,} "
                                 f"characters; a row holds at most {MAX_ROW_FEATURES:,} "
                                 "features")
    return text


def _binary_labels(path: Path, labels: np.ndarray) -> np.ndarray:
    """0/1 from -1/+1 or 0/1; any other label (or both -1 and 0) is refused."""
    seen = set(np.unique(labels).tolist())
    if not (seen <= {-1.0, 1.0} or seen <= {0.0, 1.0}):
        shown = ", ".join(f"{value:g}" for value in sorted(seen)[:5])
        raise DatasetFormatError(f"{path}: labels must be -1/+1 or 0/1 (binary), got {shown}")
    return (labels > 0).astype(np.int64)


# libsvm-hashed: scikit-learn's reader is not used, as it keeps indices in a C int (2^31 - 1 at
# most: sklearn 1.9), and a hashed file's indices may be any 64-bit number.


def _libsvm_row(path: Path, number: int, line: str) -> Row | None:
    """``label index:value ...`` (a ``#`` comment, and ``qid:``, ignored as scikit-learn does);
    None for a blank line."""
    # Split no further than one token past the bound: its objects are what a long row costs.
    tokens = line.partition("#")[0].split(maxsplit=MAX_ROW_FEATURES + 1)
    if not tokens:
        return None
    if len(tokens) > MAX_ROW_FEATURES + 1:
        raise DatasetFormatError(f"{path}, line {number}: more than {MAX_ROW_FEATURES:,} "
                                 "features; a row of a hashed data set holds at most that many")
    keys: list[int] = []
    values: list[float] = []
    try:
        label = float(tokens[0])
        for token in tokens[1:]:
            index, colon, value = token.partition(":")
            if index == "qid":
                continue
            keys.append(int(index))
            values.append(float(value) if colon else math.nan)
    except ValueError:
        raise DatasetFormatError(f"{path}, line {number}: not ``label index:value ...`` with "
                                 "numbers") from None
    if not all(0 <= key < 2**64 for key in keys):
        raise DatasetFormatError(f"{path}, line {number}: a feature index is not in 0..2^64-1")
    if not (math.isfinite(label) and all(math.isfinite(value) for value in values)):
        raise DatasetFormatError(f"{path}, line {number}: a label or value is missing, NaN or "
                                 "infinite")
    return label, keys, values


# criteo


def _criteo_row(path: Path, number: int, line: str) -> Row:
    """(label, keys, values) of line ``number``."""
    fields = line.split("\t")
    if len(fields) != CRITEO_FIELDS:
        raise DatasetFormatError(f"{path}, line {number}: {len(fields)} tab-separated fields, "
                                 f"expected {CRITEO_FIELDS} (label, 13 integers, 26 categories)")
    if fields[0] not in ("0", "1"):
        raise DatasetFormatError(f"{path}, line {number}: the label must be 0 or 1, got "
                                 f"{fields[0][:20]!r}")
    keys: list[int] = []
    try:
        for j, text in enumerate(fields[1:1 + CRITEO_INTEGERS]):
            if text:
                keys.append((CRITEO_CATEGORIES + j) << 32 | bucket(int(text)) & _LOW32)
        for j, text in enumerate(fields[1 + CRITEO_INTEGERS:]):
            if text:
                keys.append(j << 32 | int(text, 16) & _LOW32)
    except ValueError:
        raise DatasetFormatError(f"{path}, line {number}: an integer field is not an integer "
                                 "or a categorical one not hexadecimal") from None
    return float(fields[0]), keys, [1.0] * len(keys)


def bucket(n: int) -> int:
    """The 2014 Criteo winners' bucket of an integer field's value: n up to 2, else
    floor(ln(n)^2)."""
    return n if n <= 2 else math.floor(math.log(n) ** 2)
