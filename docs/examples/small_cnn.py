"""A model file for ``psctl launch --model docs/examples/small_cnn.py:build``.

psctl calls ``build(input_shape, num_classes)`` in every worker, in the evaluator and in the
coordinator, each time after seeding torch with the run's seed, so all of them start from the
same values. The servers hold the module's trainable parameters, in ``named_parameters()`` order;
the batch-norm running statistics stay in each process (docs/models.md says how the evaluator
gets its own).
"""

from __future__ import annotations

from torch import nn


def build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    channels = input_shape[0] if len(input_shape) == 3 else 1
    return nn.Sequential(
        nn.Unflatten(1, (channels, *input_shape[-2:])) if len(input_shape) == 2 else nn.Identity(),
        nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(32 * 4 * 4, num_classes),
    )
