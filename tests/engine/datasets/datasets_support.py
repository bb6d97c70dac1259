"""Shared helpers of the data-set tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.datasets.idx import write_idx
from engine.datasets.registry import DatasetSpec, FileSpec, IdxFiles
from engine.datasets.resolve import ENV_VAR

REPO = Path(__file__).resolve().parents[3]
# conftest's stand_in: registers a data set for the test, in place of one of that name.
StandIn = Callable[[DatasetSpec], None]
# Read at import, before any fixture clears the variable, so a CI that sets it is honoured.
_ENV_DATA = os.environ.get(ENV_VAR)


def shared_data_dir() -> Path | None:
    """The checkout's ../shared/data (or $PSCTL_DATA_DIR) when it holds the real data sets."""
    for candidate in (REPO / ".." / "shared" / "data", Path(_ENV_DATA) if _ENV_DATA else None):
        if candidate is not None and (candidate / "mnist").is_dir():
            return candidate.resolve()
    return None


@dataclass
class Tiny:
    """A registered synthetic data set: 12 train / 5 test images of 2x3 pixels, 3 classes."""

    spec: DatasetSpec
    dir: Path  # holds the four files directly
    blobs: dict[str, bytes]  # file name -> gzip bytes, as a mirror would serve them
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def copy_to(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        for name, blob in self.blobs.items():
            (directory / name).write_bytes(blob)
        return directory


def make_tiny(root: Path, name: str, seed: int) -> Tiny:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images.gz": rng.integers(0, 256, (12, 2, 3), dtype=np.uint8),
        "train-labels.gz": rng.integers(0, 3, 12, dtype=np.uint8),
        "test-images.gz": rng.integers(0, 256, (5, 2, 3), dtype=np.uint8),
        "test-labels.gz": rng.integers(0, 3, 5, dtype=np.uint8),
    }
    directory = root / name
    directory.mkdir(parents=True)
    for file_name, array in arrays.items():
        write_idx(directory / file_name, array)
    blobs = {n: (directory / n).read_bytes() for n in arrays}
    specs = [FileSpec(n, len(b), hashlib.md5(b).hexdigest()) for n, b in blobs.items()]
    spec = DatasetSpec(
        name=name,
        description="synthetic test data",
        input_dim=6,
        num_classes=3,
        files=IdxFiles(*specs),
        mirrors=(f"https://mirror-a.invalid/{name}/", f"https://mirror-b.invalid/{name}/"),
    )
    x_tr, y_tr, x_te, y_te = arrays.values()
    return Tiny(spec, directory, blobs, x_tr, y_tr, x_te, y_te)
