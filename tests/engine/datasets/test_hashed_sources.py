"""The hashed sparse files of issue 44: ``libsvm-hashed:PATH`` and ``criteo:PATH``, their
features hashed into ``FEATURES`` ids or the run's ``data.hash_features``, read as the same
sparse rows as sparse-synthetic."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from engine.datasets import describe, hashed, load_dataset, locate
from engine.datasets.hashed import CRITEO_CATEGORIES, FEATURES, SEED, bucket
from engine.datasets.sources import (
    check_source,
    is_sparse_source,
    is_user_source,
    label,
    load_sparse,
)
from engine.errors import ConfigError, DatasetFormatError
from engine.hashing import mix64
from engine.models.rows import rows_model
from engine.plan import build_config
from engine.roles.coordinator import model_layout
from tests.conftest import psctl
from tests.integration.support import query


def _id(key: int, features: int = FEATURES) -> int:
    """The documented hash: mix64(key, seed 0) % features (FEATURES unless the run says)."""
    return int(mix64(np.array([key], dtype=np.uint64), SEED)[0] % np.uint64(features))


def _row(split: object, row: int) -> dict[int, float]:
    indptr, indices, values = (getattr(split, name) for name in ("indptr", "indices", "values"))
    start, end = indptr[row], indptr[row + 1]
    return {int(i): float(v) for i, v in zip(indices[start:end], values[start:end], strict=True)}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# libsvm-hashed


def test_libsvm_ids_are_the_documented_hash_of_each_index_and_values_are_kept(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "a.svm", ["+1 3:0.5 7:2", "-1 0:1.5"])
    _write(tmp_path / "a.svm.t", ["-1 7:4"])
    data = load_sparse(f"libsvm-hashed:{path}")
    assert _row(data.train, 0) == {_id(3): 0.5, _id(7): 2.0}
    assert _row(data.train, 1) == {_id(0): 1.5}  # indices as written: 0 is a feature
    assert data.train.labels.tolist() == [1, 0] and data.test.labels.tolist() == [0]
    assert _row(data.test, 0) == {_id(7): 4.0}
    assert data.train.indices.dtype == np.int32 and data.train.values.dtype == np.float32
    assert data.spec.input_dim == FEATURES and data.spec.sparse and data.spec.num_classes == 2


def test_indices_above_2_to_the_31_are_hashed_like_any_other(tmp_path: Path) -> None:
    big = 2**40 + 5
    path = _write(tmp_path / "big.svm", [f"1 {big}:1 {2**31}:3", "0 1:1"])
    _write(tmp_path / "big.svm.t", ["1 1:1"])
    data = load_sparse(f"libsvm-hashed:{path}")
    assert _row(data.train, 0) == {_id(big): 1.0, _id(2**31): 3.0}


def test_two_indices_landing_on_one_id_are_summed(tmp_path: Path) -> None:
    # In 2^30 ids a collision takes about 2^15 indices; in 4, ten indices must collide.
    path = _write(tmp_path / "c.svm", ["1 " + " ".join(f"{i}:{i + 1}" for i in range(10))])
    _write(tmp_path / "c.svm.t", ["0 2:1"])
    expected: dict[int, float] = {}
    for index in range(10):
        column = int(mix64(np.array([index], dtype=np.uint64), SEED)[0] % np.uint64(4))
        expected[column] = expected.get(column, 0.0) + index + 1
    data = load_sparse(f"libsvm-hashed:{path}", hash_features=4)
    assert _row(data.train, 0) == expected and len(expected) <= 4
    assert list(data.train.indices) == sorted(expected)  # one entry per id, sorted


def test_without_a_t_file_the_last_tenth_of_the_rows_is_the_test_split(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.svm", [f"{i % 2} {i}:1" for i in range(20)])
    data = load_sparse(f"libsvm-hashed:{path}")
    assert len(data.train) == 18 and len(data.test) == 2
    assert _row(data.test, 0) == {_id(18): 1.0} and _row(data.test, 1) == {_id(19): 1.0}
    assert len(load_sparse(f"libsvm-hashed:{path}", train_limit=5).train) == 5


@pytest.mark.parametrize("labels", [["2", "1"], ["-1", "0"], ["0.5", "1"]])
def test_labels_must_be_binary(tmp_path: Path, labels: list[str]) -> None:
    path = _write(tmp_path / "e.svm", [f"{y} 1:1" for y in labels] * 3)
    with pytest.raises(DatasetFormatError, match="labels must be -1/.1 or 0/1"):
        load_sparse(f"libsvm-hashed:{path}")


@pytest.mark.parametrize(("line", "says"), [
    ("1 x:1", "not ``label index:value ...`` with numbers"),
    ("one 1:1", "not ``label index:value ...`` with numbers"),
    ("1 -3:1", "a feature index is not in 0..2^64-1"),
    (f"1 {2**64}:1", "a feature index is not in 0..2^64-1"),
    ("1 4:nan", "a label or value is missing, NaN or infinite"),
    ("1 4", "a label or value is missing, NaN or infinite"),
])
def test_a_malformed_libsvm_line_is_refused_with_its_number(tmp_path: Path, line: str,
                                                            says: str) -> None:
    path = _write(tmp_path / "f.svm", ["1 1:1 # a comment", "", line])
    with pytest.raises(DatasetFormatError, match=rf"f\.svm, line 3: {re.escape(says)}"):
        locate(f"libsvm-hashed:{path}")


def test_a_row_of_more_features_than_the_bound_is_refused_in_one_line(tmp_path: Path) -> None:
    most = hashed.MAX_ROW_FEATURES
    features = " ".join(f"{i}:1" for i in range(most))
    path = _write(tmp_path / "wide.svm", ["0 1:1", f"1 {features}", "0 2:1"] * 4)
    train = load_sparse(f"libsvm-hashed:{path}").train
    assert max(np.diff(train.indptr)) == most  # at the bound: taken
    _write(path, ["0 1:1", f"1 {features} {most}:1"])
    with pytest.raises(DatasetFormatError) as refused:
        locate(f"libsvm-hashed:{path}")
    assert str(refused.value) == (f"{path}, line 2: more than 65,536 features; a row of a "
                                  "hashed data set holds at most that many")


def test_a_16_mb_line_is_refused_without_holding_its_features(tmp_path: Path) -> None:
    """Issue 57: one 16.5 MB line (1.5 million features) cost 370 MB in every process that
    loaded the file. It is refused now, having held no more than a bounded piece of it."""
    import tracemalloc

    path = tmp_path / "long.svm"
    with path.open("w") as handle:
        handle.write("0 1:1\n1 " + " ".join(f"{i * 7}:0.5" for i in range(1_500_000)) + "\n")
    assert path.stat().st_size > 16_500_000
    tracemalloc.start()
    try:
        with pytest.raises(DatasetFormatError, match="line 2: longer than 4,194,304 characters"):
            load_sparse(f"libsvm-hashed:{path}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"reading it held {peak / 2**20:.0f} MiB at the peak"


@pytest.mark.parametrize("kind", ["libsvm-hashed", "criteo"])
def test_a_line_longer_than_the_bound_is_refused_with_its_number(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashed, "MAX_LINE_CHARS", 64)
    first = "1 1:1" if kind == "libsvm-hashed" else _criteo(1, ["1"], ["ab"])
    path = _write(tmp_path / "long.txt", [first, first + " #" + "x" * 100, first])
    with pytest.raises(DatasetFormatError, match=r"long\.txt, line 2: longer than 64 characters"):
        locate(f"{kind}:{path}")


def test_the_name_is_made_absolute_and_the_data_set_is_sparse(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    _write(tmp_path / "g.svm", ["1 1:1", "0 2:1"])
    monkeypatch.chdir(tmp_path)
    name = check_source("libsvm-hashed:g.svm")
    assert name == f"libsvm-hashed:{(tmp_path / 'g.svm').resolve()}"
    assert is_sparse_source(name) and is_user_source(name) and label(name) == "g.svm"
    assert locate(name) == str((tmp_path / "g.svm").resolve())
    assert describe(name).sparse and describe(name).name == name
    with pytest.raises(ConfigError, match="sparse samples"):
        load_dataset(name)
    with pytest.raises(ConfigError, match="is not a file"):
        check_source("libsvm-hashed:none.svm")
    with pytest.raises(ConfigError, match="name the file, criteo:PATH"):
        check_source("criteo")
    config = build_config({}, {"data.dataset": "libsvm-hashed:g.svm"})
    assert config.data.dataset == name and config.model.name == "logreg"
    assert config.sync.model == "bounded-delay"  # as a sparse-synthetic run implies


# criteo


def _criteo(label: int, integers: list[str], categories: list[str]) -> str:
    integers = integers + [""] * (13 - len(integers))
    categories = categories + [""] * (CRITEO_CATEGORIES - len(categories))
    return "\t".join([str(label), *integers, *categories])


def test_the_winners_buckets() -> None:
    assert [bucket(n) for n in (-1, 0, 1, 2)] == [-1, 0, 1, 2]
    assert bucket(3) == math.floor(math.log(3) ** 2) == 1
    assert bucket(1000) == 47


def test_criteo_keys_keep_fields_apart_and_skip_empty_fields(tmp_path: Path) -> None:
    path = _write(tmp_path / "day.txt", [
        _criteo(1, ["5", "", "-1"], ["68fd1e64", "", "68fd1e64"]),
        _criteo(0, [], []),
    ])
    _write(tmp_path / "day.txt.t", [_criteo(0, ["1000"], [])])
    data = load_sparse(f"criteo:{path}")
    value = 0x68FD1E64
    expected = {_id(26 << 32 | bucket(5)), _id(28 << 32 | 0xFFFFFFFF),  # -1's own bucket
                _id(0 << 32 | value), _id(2 << 32 | value)}  # one value, two fields: two ids
    assert _row(data.train, 0) == dict.fromkeys(expected, 1.0)
    assert _row(data.train, 1) == {}  # every field empty
    assert _row(data.test, 0) == {_id(26 << 32 | 47): 1.0}
    assert data.train.labels.tolist() == [1, 0]
    assert label(f"criteo:{path}") == "day.txt"


def test_criteo_without_a_t_file_holds_out_its_last_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "log.tsv", [_criteo(i % 2, [str(i)], []) for i in range(30)])
    data = load_sparse(f"criteo:{path}")
    assert len(data.train) == 27 and len(data.test) == 3
    assert data.test.labels.tolist() == [1, 0, 1]


@pytest.mark.parametrize(("line", "says"), [
    ("1\t2\t3", "line 2: 3 tab-separated fields, expected 40"),
    (_criteo(2, [], []), "line 2: the label must be 0 or 1"),
    (_criteo(1, ["1.5"], []), "line 2: an integer field is not an integer"),
    (_criteo(1, [], ["zz"]), "line 2: an integer field is not an integer or a categorical one "
                             "not hexadecimal"),
])
def test_a_malformed_criteo_line_is_refused_with_its_number(tmp_path: Path, line: str,
                                                             says: str) -> None:
    path = _write(tmp_path / "bad.tsv", [_criteo(0, ["1"], ["ab"]), line])
    with pytest.raises(DatasetFormatError, match=f"bad.tsv, {says}"):
        locate(f"criteo:{path}")


def test_criteo_files_past_the_row_limit_are_refused(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.datasets.hashed.MAX_ROWS", 3)
    path = _write(tmp_path / "long.tsv", [_criteo(0, [], [])] * 4)
    with pytest.raises(DatasetFormatError, match="more than 3 rows"):
        load_sparse(f"criteo:{path}")


# The hashed space: data.hash_features, --hash-features


def test_a_small_hash_space_gives_every_id_below_it_in_every_part_of_a_run(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "s.svm", [f"{i % 2} " + " ".join(f"{1000 * i + j}:1"
                                                               for j in range(20))
                                       for i in range(40)])
    config = build_config({}, {"data.dataset": f"libsvm-hashed:{path}",
                               "data.hash_features": "2^8"})
    assert config.data.hash_features == 256
    data = load_sparse(config.data.dataset, hash_features=config.data.hash_features)
    for split in (data.train, data.test):
        assert split.indices.dtype == np.int32 and split.indices.min() >= 0
        assert split.indices.max() < 2**8
    expected: dict[int, float] = {}
    for index in range(20):  # row 0's indices, some of them colliding in 256 ids
        expected[_id(index, 2**8)] = expected.get(_id(index, 2**8), 0.0) + 1.0
    assert _row(data.train, 0) == expected
    assert data.spec.input_dim == 2**8 and "hashed into 2^8 ids" in data.spec.description
    # The coordinator lays out, and the evaluator pulls, keys of that space, not of 2^30.
    assert model_layout(config).num_keys == 2**8
    evaluation = rows_model(config.model, data.spec.input_dim).evaluation(data.train,
                                                                           data.test, 0.0)
    assert evaluation.keys.max() < 2**8
    embedding = build_config({}, {"data.dataset": f"libsvm-hashed:{path}",
                                  "data.hash_features": 1000, "model.name": "embedding"})
    assert model_layout(embedding).segments[0].shape == (1000, 8)


def test_the_space_is_the_default_one_unless_the_run_gives_another(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.svm", ["1 3:1", "0 4:1"])
    config = build_config({}, {"data.dataset": f"libsvm-hashed:{path}"})
    assert config.data.hash_features == FEATURES == 2**30  # written out, as the run used it
    assert describe(config.data.dataset).input_dim == FEATURES  # a run stored before: None
    assert build_config({"data": {"hash_features": 4096}},
                        {"data.dataset": f"criteo:{path}"}).data.hash_features == 4096
    wide = load_sparse(f"libsvm-hashed:{path}", hash_features=2**40)
    assert wide.train.indices.dtype == np.int64  # past 2^31 - 1 ids, as sparse-synthetic's
    assert _row(wide.train, 0) == {_id(3, 2**40): 1.0}


@pytest.mark.parametrize(("given", "says"), [
    ({"data.hash_features": "2^x"}, "data.hash_features: a whole number such as 2^24 or "
                                     "16777216, not '2^x'"),
    ({"data.hash_features": 1}, "data.hash_features: Input should be greater than or equal "
                                "to 2"),
    ({"data.hash_features": "2^63"}, "data.hash_features: Input should be less than or equal "
                                     "to 4611686018427387904"),
    ({"data.hash_features": "2^8", "data.dataset": "digits"},
     "data.hash_features (--hash-features) is the number of ids libsvm-hashed:PATH and "
     "criteo:PATH hash their features into; data set digits is neither"),
    ({"data.hash_features": 256, "data.dataset": "sparse-synthetic:features=1000"},
     "data set sparse-synthetic is neither (sparse-synthetic sizes its own: "
     "sparse-synthetic:features=N)"),
])
def test_a_space_that_cannot_be_used_is_refused_saying_why(tmp_path: Path,
                                                          given: dict[str, object],
                                                          says: str) -> None:
    path = _write(tmp_path / "u.svm", ["1 3:1", "0 4:1"])
    with pytest.raises(ConfigError, match=re.escape(says)):
        build_config({}, {"data.dataset": f"libsvm-hashed:{path}", **given})
    with pytest.raises(ConfigError, match=r"hashed into 2\.\.2\^62 ids, not 1"):
        load_sparse(f"libsvm-hashed:{path}", hash_features=1)


# A real run


def _learnable(path: Path, rows: int) -> None:
    """Rows whose label is the sign of a fixed linear rule over 40 features, 8 per row."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=40)
    lines = []
    for _ in range(rows):
        chosen = rng.choice(40, size=8, replace=False)
        values = rng.uniform(0.5, 1.5, size=8)
        margin = float(weights[chosen] @ values)
        features = " ".join(f"{1000 * i + 1}:{v:.3f}" for i, v in zip(chosen, values,
                                                                      strict=True))
        lines.append(f"{'+1' if margin > 0 else '-1'} {features}")
    _write(path, lines)


@pytest.mark.integration
def test_logreg_trains_on_a_hashed_libsvm_file(tmp_path: Path) -> None:
    path = tmp_path / "rule.svm"
    _learnable(path, 2000)
    db = tmp_path / "runs.db"
    done = psctl("launch", "--model", "logreg", "--dataset", f"libsvm-hashed:{path}",
                 "--workers", "2", "--servers", "2", "--epochs", "2", "--no-live", db=db)
    assert done.returncode == 0, done.stdout + done.stderr
    objectives = [row[0] for row in query(db, "SELECT loss FROM evaluations ORDER BY at")]
    assert len(objectives) >= 2 and objectives[-1] < objectives[0]
    (config,) = query(db, "SELECT config_json FROM runs")[0]
    assert json.loads(config)["data"]["dataset"] == f"libsvm-hashed:{path.resolve()}"
