"""``FlatModel.watch_values``: the forward pass asks for each layer's values right before that
layer runs, so a worker can start computing before every pull is answered."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from engine.models.flat import FlatModel, train_step
from engine.models.spec import MLPSpec

SPEC = MLPSpec(input_dim=5, hidden=(4, 3), num_classes=2)
INPUTS = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
TARGETS = torch.tensor([0, 1, 1, 0, 1, 0])


def test_each_layer_asks_for_its_values_right_before_it_runs_and_computes_with_them() -> None:
    arrived = FlatModel(SPEC, seed=1).params_np.copy()  # what the "pulls" will bring
    model = FlatModel(SPEC, seed=0)
    asked: list[int] = []

    def need(index: int) -> None:
        keys = model.layout.segments[index].keys
        asked.append(index)
        # Values of layers not asked for yet must not be read: make them poison until then.
        model.params_np[keys.start:keys.end] = arrived[keys.start:keys.end]

    stop = model.watch_values(need)
    assert stop is not None
    model.params_np[:] = np.nan
    loss = train_step(model, INPUTS, TARGETS)
    assert asked == list(range(len(model.layout.segments)))  # forward order, each once
    reference = FlatModel(SPEC, seed=1)
    assert loss == train_step(reference, INPUTS, TARGETS)
    np.testing.assert_array_equal(model.grads_np, reference.grads_np)

    asked.clear()
    train_step(model, INPUTS, TARGETS)  # every forward pass asks again
    assert asked == list(range(len(model.layout.segments)))
    stop()
    asked.clear()
    train_step(model, INPUTS, TARGETS)
    assert asked == []


class Shared(nn.Module):
    """One layer applied twice: its values are asked for once per forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(torch.relu(self.layer(x)))


def test_a_layer_run_twice_asks_once() -> None:
    model = FlatModel.of(Shared())
    asked: list[int] = []
    assert model.watch_values(asked.append) is not None
    train_step(model, torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    assert asked == [0, 1]


class Scaled(nn.Module):
    """A custom module that holds a parameter: psctl cannot tell when it reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * self.scale


def test_a_custom_module_holding_parameters_is_not_watched() -> None:
    model = FlatModel.of(Scaled())
    asked: list[int] = []
    assert model.watch_values(asked.append) is None
    train_step(model, torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
    assert asked == []
