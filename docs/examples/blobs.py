"""A data set file for ``psctl launch --dataset docs/examples/blobs.py:load``.

``load()`` returns ``(train_x, train_y, test_x, test_y)``: inputs of any sample shape (here
vectors of 20 numbers), labels integers from 0. psctl uses the arrays as they are (as float32),
so normalise them here. This one is three Gaussian clusters, the same on every call.
"""

from __future__ import annotations

import numpy as np


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 1.0, size=(3, 20))
    labels = rng.integers(0, 3, size=3000)
    inputs = centres[labels] + rng.normal(0.0, 1.0, size=(3000, 20))
    inputs = (inputs - inputs.mean(axis=0)) / inputs.std(axis=0)
    return inputs[:2400], labels[:2400], inputs[2400:], labels[2400:]
