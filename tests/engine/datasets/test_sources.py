"""User data sets: a loader file's arrays checked and used as given, libsvm files read by
scikit-learn with their test file or a held-out fifth, labels mapped to 0..K-1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.datasets import describe, load_dataset, locate
from engine.datasets.sources import check_source, is_user_source, label
from engine.errors import ConfigError, DatasetFormatError
from tests.conftest import REPO

BLOBS = REPO / "docs" / "examples" / "blobs.py"


def test_the_example_loader_file() -> None:
    data = load_dataset(f"{BLOBS}:load", train_limit=1000)
    assert data.train_x.shape == (1000, 20) and data.train_x.dtype == np.float32
    assert data.test_x.shape == (600, 20) and data.test_y.dtype == np.int64
    assert data.spec.num_classes == 3 and data.spec.sample_shape == (20,)
    assert describe(f"{BLOBS}:load").input_dim == 20
    assert locate(str(BLOBS)) == f"{BLOBS.resolve()}:load"  # :load is the default function
    assert label(f"{BLOBS}:load") == "blobs"


def _loader(tmp_path: Path, returns: str) -> str:
    path = tmp_path / "mydata.py"
    path.write_text("import numpy as np\n\ndef load():\n    return " + returns + "\n")
    return f"{path}:load"


def test_image_shapes_are_kept(tmp_path: Path) -> None:
    name = _loader(tmp_path, "np.zeros((6, 3, 4, 5)), np.arange(6) % 2, np.ones((2, 3, 4, 5)), "
                             "np.array([0, 1])")
    data = load_dataset(name)
    assert data.train_x.shape == (6, 3, 4, 5) and data.spec.sample_shape == (3, 4, 5)
    assert data.spec.input_dim == 60 and data.spec.num_classes == 2


@pytest.mark.parametrize(("returns", "says"), [
    ("np.zeros((4, 2)), np.zeros(4, int)", "must return .*got tuple"),
    ("np.zeros((4, 2)), np.zeros(4, int), np.zeros((2, 3)), np.zeros(2, int)",
     r"train samples have shape \(2,\), test samples \(3,\)"),
    ("np.zeros((4, 2)), np.zeros(3, int), np.zeros((2, 2)), np.zeros(2, int)",
     "4 train samples and 3 labels"),
    ("np.zeros((4, 2)), np.zeros(4), np.zeros((2, 2)), np.zeros(2, int)",
     "labels must be a 1-d array of integers"),
    ("np.zeros((4, 2)), -np.ones(4, int), np.zeros((2, 2)), np.zeros(2, int)",
     "labels must be a 1-d array of integers"),
    ("np.full((4, 2), np.nan), np.zeros(4, int), np.zeros((2, 2)), np.zeros(2, int)",
     "train_x holds NaN"),
    ("np.zeros(4), np.zeros(4, int), np.zeros((2, 2)), np.zeros(2, int)",
     r"train_x must be numbers of shape \(N, ...\)"),
    ("1 / 0", r"load\(\) raised ZeroDivisionError"),
])
def test_a_bad_loader_says_what_is_wrong(tmp_path: Path, returns: str, says: str) -> None:
    with pytest.raises((DatasetFormatError, ConfigError), match=says):
        load_dataset(_loader(tmp_path, returns))


LINES = ["+1 1:0.5 3:1", "-1 2:2.0", "+1 1:1.5 4:0.25", "-1 3:-1", "+1 2:1", "-1 1:3"]


def test_a_libsvm_file_holds_out_a_fifth_and_maps_labels(tmp_path: Path) -> None:
    path = tmp_path / "small.svm"
    path.write_text("\n".join(LINES * 5) + "\n")
    data = load_dataset(f"libsvm:{path}")
    assert len(data.train_y) == 24 and len(data.test_y) == 6
    assert data.train_x.shape == (24, 4) and data.train_x.dtype == np.float32
    assert set(np.unique(np.concatenate([data.train_y, data.test_y]))) == {0, 1}
    assert data.spec.num_classes == 2 and label(f"libsvm:{path}") == "small.svm"
    rows = {(*x.tolist(), int(y)) for x, y in zip(data.train_x, data.train_y, strict=True)}
    assert (0.5, 0.0, 1.0, 0.0, 1) in rows  # "+1 1:0.5 3:1": 1-based indices, +1 -> 1


def test_a_libsvm_test_file_beside_it_is_the_test_set(tmp_path: Path) -> None:
    path = tmp_path / "a9"
    path.write_text("\n".join(LINES) + "\n")
    (tmp_path / "a9.t").write_text("+1 5:1\n-1 1:1\n")  # a feature the training file lacks
    data = load_dataset(f"libsvm:{path}")
    assert data.train_x.shape == (6, 5) and data.test_x.shape == (2, 5)
    assert data.test_y.tolist() == [1, 0]


def test_bad_libsvm_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        check_source(f"libsvm:{tmp_path / 'none'}")
    broken = tmp_path / "broken.svm"
    broken.write_text("+1 this is not libsvm\n")
    with pytest.raises(DatasetFormatError, match="not a readable libsvm file"):
        load_dataset(f"libsvm:{broken}")


def test_named_data_sets_are_not_user_sources() -> None:
    assert not is_user_source("mnist") and check_source("mnist") == "mnist"
    assert is_user_source("x.py") and is_user_source("x.py:fn") and is_user_source("libsvm:x")


# -- bad libsvm files (issue 37): one line naming the file, checked when the launch locates it --


BAD_LIBSVM = {
    "empty": ("", "0 samples; a libsvm data set needs at least 2 (one to train on, one to test)"),
    "one-sample": ("+1 1:0.5 2:1\n", "1 sample; a libsvm data set needs at least 2"),
    "index-past-2^63": ("+1 18446744073709551617:1\n-1 1:1\n-1 2:1\n",
                        "not a readable libsvm file: a feature index or label is above 2^63"),
    "nan": ("+1 1:nan 2:1\n-1 1:1\n+1 2:1\n", "holds NaN or infinite features or labels"),
    "inf": ("+1 1:1\n-1 1:inf\n+1 2:1\n", "holds NaN or infinite features or labels"),
    # 208 bytes declaring 2^24 features: 1 GiB of dense inputs in every process
    "wide": ("".join(f"{i % 2} 16777216:1\n" for i in range(16)),
             "16 samples x 16777216 features would take 1.0 GiB as the dense float32 inputs "
             "every process loads (limit 256 MiB)"),
}


@pytest.mark.parametrize("case", BAD_LIBSVM)
def test_a_bad_libsvm_file_is_refused_in_one_line_when_located(tmp_path: Path,
                                                                case: str) -> None:
    from engine.datasets import locate

    text, says = BAD_LIBSVM[case]
    path = tmp_path / f"{case}.svm"
    path.write_text(text)
    for attempt in (lambda: locate(f"libsvm:{path}"), lambda: load_dataset(f"libsvm:{path}")):
        with pytest.raises(DatasetFormatError) as caught:
            attempt()
        assert str(caught.value).startswith(f"{path}: {says}")
        assert "\n" not in str(caught.value)


def test_an_empty_test_file_beside_it_is_named(tmp_path: Path) -> None:
    path = tmp_path / "a9"
    path.write_text("\n".join(LINES) + "\n")
    (tmp_path / "a9.t").write_text("")
    with pytest.raises(DatasetFormatError, match=r"a9\.t: 0 samples; a libsvm data set needs "
                                                 "at least 1$"):
        load_dataset(f"libsvm:{path}")


def test_two_samples_hold_one_out(tmp_path: Path) -> None:
    path = tmp_path / "two.svm"
    path.write_text("+1 1:1\n-1 2:1\n")
    data = load_dataset(f"libsvm:{path}")
    assert (len(data.train_y), len(data.test_y)) == (1, 1)


def test_the_documented_dense_limit_is_the_one_in_force() -> None:
    from engine.datasets.sources import MAX_DENSE_BYTES
    from tests.conftest import REPO

    doc = " ".join((REPO / "docs" / "models.md").read_text().split())
    assert f"more than {MAX_DENSE_BYTES >> 20} MiB as dense float32" in doc
