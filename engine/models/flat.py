"""The torch model, with every parameter and gradient a view into one flat float32 buffer.

Flat buffers let a worker pull straight into its parameters and push its gradient without
gathering tensors: the key space of ``engine.models.spec`` is exactly the layout of these buffers.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from engine.models.spec import MLPSpec


class MLP(nn.Module):
    def __init__(self, spec: MLPSpec) -> None:
        super().__init__()
        widths = spec.widths
        self.layers = nn.ModuleList(
            nn.Linear(fan_in, fan_out) for fan_in, fan_out in itertools.pairwise(widths)
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = inputs
        for layer in self.layers[:-1]:
            hidden = torch.relu(layer(hidden))
        logits: torch.Tensor = self.layers[-1](hidden)
        return logits


class FlatModel:
    """A model whose parameters and gradients live in two flat buffers (numpy views given)."""

    def __init__(self, spec: MLPSpec, *, seed: int) -> None:
        torch.manual_seed(seed)
        self.module = MLP(spec)
        self.spec = spec
        self.params = torch.zeros(spec.num_keys, dtype=torch.float32)
        self.grads = torch.zeros(spec.num_keys, dtype=torch.float32)
        named = dict(self.module.named_parameters())
        for segment in spec.segments():
            parameter = named[segment.name]
            keys = slice(segment.keys.start, segment.keys.end)
            self.params[keys].copy_(parameter.detach().reshape(-1))
            parameter.data = self.params[keys].view(segment.shape)
            parameter.grad = self.grads[keys].view(segment.shape)

    @property
    def params_np(self) -> np.ndarray:
        return self.params.numpy()

    @property
    def grads_np(self) -> np.ndarray:
        return self.grads.numpy()

    def zero_grad(self) -> None:
        self.grads.zero_()


def train_step(model: FlatModel, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Forward and backward; the gradient lands in ``model.grads``. Returns the batch loss."""
    model.zero_grad()
    loss = nn.functional.cross_entropy(model.module(inputs), targets)
    cast(Any, loss).backward()  # torch's stubs leave backward untyped
    return float(loss.detach())


def train_step_np(model: FlatModel, inputs: np.ndarray, targets: np.ndarray) -> float:
    """``train_step`` on numpy batches (shared memory, no copy)."""
    return train_step(model, torch.from_numpy(inputs), torch.from_numpy(targets))


@torch.no_grad()
def evaluate(
    module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 4096
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) over the whole set."""
    correct, loss_sum = 0, 0.0
    for start in range(0, len(inputs), batch_size):
        logits = module(inputs[start : start + batch_size])
        batch_targets = targets[start : start + batch_size]
        loss_sum += float(nn.functional.cross_entropy(logits, batch_targets, reduction="sum"))
        correct += int((logits.argmax(dim=1) == batch_targets).sum())
    return correct / len(inputs), loss_sum / len(inputs)
