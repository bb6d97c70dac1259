"""engine.datasets.shared: a data set the warm template preloads is what ``load_dataset``
gives every role forked after it (the same arrays, read-only, so their pages stay shared)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.datasets import load_dataset, shared
from engine.datasets.loader import preload
from engine.datasets.sources import load_sparse


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    yield
    shared._LOADED.clear()


def test_a_preloaded_data_set_is_the_one_loaded_and_cannot_be_written() -> None:
    assert preload("digits", None, 200)
    first = load_dataset("digits", None, train_limit=200)
    assert load_dataset("digits", None, train_limit=200) is first
    with pytest.raises(ValueError, match="read-only"):
        first.train_x[0, 0] = 1.0
    other = load_dataset("digits", None, train_limit=100)  # another limit: loaded afresh
    assert other is not first and other.train_x.flags.writeable
    assert len(other.train_x) == 100 and len(first.train_x) == 200


def test_a_sparse_data_set_is_generated_once_and_a_users_is_left_to_the_roles() -> None:
    name = "sparse-synthetic:features=1000,nnz=5,samples=200,test=50"
    assert preload(name, None, None)
    kept = load_sparse(name)
    assert load_sparse(name) is kept and not kept.train.indices.flags.writeable
    assert not preload("some_file.py:make", None, None)


def test_a_hashed_file_is_kept_for_the_space_it_was_hashed_into(tmp_path: Path) -> None:
    path = tmp_path / "k.svm"
    path.write_text("1 3:1 70000:1\n0 4:1\n")
    name = f"libsvm-hashed:{path}"
    assert preload(name, None, None, 2**8)
    kept = load_sparse(name, hash_features=2**8)
    assert load_sparse(name, hash_features=2**8) is kept and kept.spec.input_dim == 2**8
    default = load_sparse(name)  # another space: read afresh, not the template's copy
    assert default is not kept and default.spec.input_dim == 2**30
