"""The public API: registry look-ups, loading, normalisation, digits and the real data sets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datasets_support import REPO, StandIn, Tiny, shared_data_dir

from engine.datasets import (
    Dataset,
    dataset_names,
    get_spec,
    load_dataset,
    locate,
)
from engine.datasets.idx import write_idx
from engine.datasets.resolve import ENV_VAR
from engine.errors import ChecksumMismatch, ConfigError, DatasetFormatError

# -- registry -----------------------------------------------------------------------------------


def test_known_names() -> None:
    assert {"mnist", "fashion-mnist", "digits"} <= set(dataset_names())
    assert get_spec(" MNIST ").name == "mnist"


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"'cifar'.*digits, fashion-mnist, mnist"):
        get_spec("cifar")


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_file_specs_are_well_formed(name: str) -> None:
    spec = get_spec(name)
    assert spec.files is not None and spec.input_dim == 784 and spec.num_classes == 10
    for file in spec.files.all():
        assert file.size > 0 and len(file.md5) == 32 and int(file.md5, 16) >= 0
    assert spec.mirrors and all(m.startswith("http") and m.endswith("/") for m in spec.mirrors)


def test_mnist_checksums_are_the_published_ones() -> None:
    files = get_spec("mnist").files
    assert files is not None
    assert files.train_images.size == 9912422
    assert files.train_images.md5 == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert files.test_labels.md5 == "ec29112dd5afa0611ce80d1b7f02629c"


def test_importing_the_package_stays_light() -> None:
    code = (
        "import sys, engine.datasets; "
        "heavy = {'torch', 'sklearn', 'urllib.request'} & set(sys.modules); "
        "sys.exit(f'imported {heavy}' if heavy else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout


# -- loading the synthetic set ------------------------------------------------------------------


def test_load_shapes_types_and_labels(tiny: Tiny) -> None:
    data = load_dataset("tiny", tiny.dir, allow_download=False)
    assert isinstance(data, Dataset) and data.spec is tiny.spec
    assert data.source == str(tiny.dir.resolve())
    assert data.train_x.shape == (12, 6) and data.test_x.shape == (5, 6)
    assert data.train_x.dtype == np.float32 and data.test_x.dtype == np.float32
    assert data.train_y.dtype == np.int64 and data.test_y.dtype == np.int64
    np.testing.assert_array_equal(data.train_y, tiny.train_y)
    np.testing.assert_array_equal(data.test_y, tiny.test_y)


def test_normalisation_uses_training_statistics_for_both_splits(tiny: Tiny) -> None:
    data = load_dataset("tiny", tiny.dir)
    raw_train = tiny.train_x.reshape(12, 6).astype(np.float64)
    assert data.pixel_mean == pytest.approx(raw_train.mean())
    assert data.pixel_std == pytest.approx(raw_train.std())
    assert abs(float(data.train_x.mean())) < 1e-6
    assert float(data.train_x.std()) == pytest.approx(1.0, abs=1e-5)
    expected_test = (tiny.test_x.reshape(5, 6) - raw_train.mean()) / raw_train.std()
    np.testing.assert_allclose(data.test_x, expected_test, rtol=1e-5, atol=1e-5)


def test_train_limit_keeps_the_first_samples(tiny: Tiny) -> None:
    full = load_dataset("tiny", tiny.dir)
    part = load_dataset("tiny", tiny.dir, train_limit=4)
    assert part.train_x.shape == (4, 6) and part.test_x.shape == (5, 6)
    np.testing.assert_array_equal(part.train_y, full.train_y[:4])
    # Statistics come from the kept samples, so the kept training set is itself standardised.
    assert abs(float(part.train_x.mean())) < 1e-6
    assert load_dataset("tiny", tiny.dir, train_limit=1000).train_x.shape == (12, 6)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_train_limit_must_be_positive(tiny: Tiny, bad: object) -> None:
    with pytest.raises(ConfigError, match="train_limit"):
        load_dataset("tiny", tiny.dir, train_limit=bad)  # type: ignore[arg-type]


def _replace(tiny: Tiny, name: str, array: np.ndarray, stand_in: StandIn) -> None:
    """Swap one file for ``array`` and re-register the spec with its new checksum."""
    import dataclasses
    import hashlib

    write_idx(tiny.dir / name, array)
    blob = (tiny.dir / name).read_bytes()
    assert tiny.spec.files is not None
    fields = {f.name: f for f in dataclasses.fields(tiny.spec.files)}
    key = next(k for k in fields if getattr(tiny.spec.files, k).name == name)
    new_file = dataclasses.replace(
        getattr(tiny.spec.files, key), size=len(blob), md5=hashlib.md5(blob).hexdigest()
    )
    files = dataclasses.replace(tiny.spec.files, **{key: new_file})
    stand_in(dataclasses.replace(tiny.spec, files=files))


@pytest.mark.parametrize(
    ("name", "array", "complaint"),
    [
        ("train-labels.gz", np.array([0, 1, 2, 3] * 3, dtype=np.uint8), "labels range over 0..3"),
        ("test-labels.gz", np.zeros(4, dtype=np.uint8), "4 labels for 5 images"),
        ("test-labels.gz", np.zeros((5, 1), dtype=np.uint8), "1-d integer label vector"),
        ("train-images.gz", np.zeros((12, 2, 2), dtype=np.uint8), "4 values, expected 6"),
        ("train-images.gz", np.zeros((12, 6), dtype=np.float32), "expected uint8 images"),
    ],
)
def test_inconsistent_files_are_format_errors(
    tiny: Tiny, stand_in: StandIn, name: str, array: np.ndarray, complaint: str
) -> None:
    _replace(tiny, name, array, stand_in)
    with pytest.raises(DatasetFormatError, match=complaint):
        load_dataset("tiny", tiny.dir)


# -- digits -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def test_digits_shapes_and_split(digits: Dataset) -> None:
    assert digits.source == "sklearn" == locate("digits")
    assert digits.train_x.shape == (1438, 1, 8, 8) and digits.test_x.shape == (359, 1, 8, 8)
    assert digits.train_y.shape == (1438,) and digits.test_y.shape == (359,)
    assert set(np.unique(digits.test_y)) == set(range(10))


def test_digits_split_is_a_partition_of_the_original(digits: Dataset) -> None:
    from sklearn.datasets import load_digits

    original = load_digits()
    restored = np.concatenate([digits.train_x, digits.test_x]).reshape(-1, 64) * digits.pixel_std
    restored = np.rint(restored + digits.pixel_mean).astype(np.int64)
    labels = np.concatenate([digits.train_y, digits.test_y])
    assert restored.min() == 0 and restored.max() == 16
    assert np.bincount(labels).tolist() == np.bincount(original.target).tolist()
    # Same multiset of (pixels, label) rows: nothing lost, nothing duplicated across splits.
    ours = np.column_stack([restored, labels]).tolist()
    theirs = np.column_stack([original.data.astype(np.int64), original.target]).tolist()
    assert sorted(ours) == sorted(theirs)


def test_digits_are_read_as_scikit_learn_reads_them_without_importing_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sklearn.datasets import load_digits

    from engine.datasets import loader

    x, y = load_digits(return_X_y=True)
    expected = np.column_stack([x, y])
    np.testing.assert_array_equal(loader._digits_table(), expected)
    # A scikit-learn without the file where psctl looks: its own function reads it.
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    np.testing.assert_array_equal(loader._digits_table(), expected)
    probe = ("import sys\nfrom engine.datasets import load_dataset\n"
             "load_dataset('digits')\nprint('sklearn' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


def test_digits_is_deterministic_and_limitable(digits: Dataset) -> None:
    again = load_dataset("digits", train_limit=100)
    assert again.train_x.shape == (100, 1, 8, 8)
    np.testing.assert_array_equal(again.train_y, digits.train_y[:100])
    np.testing.assert_array_equal(again.test_y, digits.test_y)


# -- the real files, when this checkout has them ------------------------------------------------

SHARED = shared_data_dir()
needs_shared = pytest.mark.skipif(
    SHARED is None,
    reason=f"real data sets absent: no mnist/ in {REPO.parent / 'shared' / 'data'} or ${ENV_VAR}",
)
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


@needs_shared
def test_real_mnist() -> None:
    assert SHARED is not None
    data = load_dataset("mnist", SHARED, allow_download=False)
    assert data.source == str(SHARED / "mnist")
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert data.train_y.shape == (60000,) and data.test_y.shape == (10000,)
    assert np.bincount(data.train_y).tolist() == MNIST_TRAIN_COUNTS
    assert data.pixel_mean == pytest.approx(0.1307 * 255, rel=1e-3)
    assert data.pixel_std == pytest.approx(0.3081 * 255, rel=1e-3)


@needs_shared
def test_real_fashion_mnist_through_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(SHARED))
    data = load_dataset("fashion-mnist", allow_download=False, train_limit=500)
    assert data.train_x.shape == (500, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert np.bincount(data.test_y).tolist() == [1000] * 10


@needs_shared
def test_real_mnist_pointed_at_fashion_files() -> None:
    assert SHARED is not None
    with pytest.raises(ChecksumMismatch, match="This file is fashion-mnist/"):
        locate("mnist", SHARED / "fashion-mnist")


def test_a_str_data_dir_is_accepted(tiny: Tiny) -> None:
    # The CLI may pass a str from argparse/typer; the annotation says Path but both work.
    assert locate("tiny", str(tiny.dir)) == str(tiny.dir.resolve())  # type: ignore[arg-type]
    assert Path(load_dataset("tiny", tiny.dir).source) == tiny.dir.resolve()
