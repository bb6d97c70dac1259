"""A loaded data set: normalised arrays and the spec they came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.datasets.registry import DatasetSpec


@dataclass(frozen=True, eq=False)  # eq=False: comparing arrays elementwise has no single truth
class Dataset:
    """A loaded data set. Inputs are float32 ``(N, *spec.sample_shape)`` (images keep their
    channels, height and width), labels int64 ``(N,)``."""

    spec: DatasetSpec
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    source: str
    # The statistics applied, in raw pixel units, to normalise further inputs the same way.
    pixel_mean: float = 0.0
    pixel_std: float = 1.0

    def __repr__(self) -> str:
        return (
            f"Dataset({self.spec.name!r}, train={self.train_x.shape}, test={self.test_x.shape}, "
            f"source={self.source!r})"
        )
