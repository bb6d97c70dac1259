"""A model that logs metrics of its own, for ``psctl launch --model
docs/examples/logged_metrics.py:build``.

``psctl.log(name, value)`` records ``value`` with the run: on a worker, for the iteration whose
forward and backward passes called it; on the evaluator, for the evaluation (the mean over the
test set's batches). Here the gradient's norm is logged from a gradient hook, once per backward
pass, and the share of active hidden units from ``forward``, so on the workers and the
evaluator alike. Outside a run (a plain script, a test) ``psctl.log`` checks its arguments and
keeps nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

import psctl


class LoggedMLP(nn.Module):
    def __init__(self, inputs: int, num_classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(inputs, 64)
        self.out = nn.Linear(64, num_classes)
        # Called once per backward pass, when the gradients of all the parameters are ready.
        torch.autograd.graph.register_multi_grad_hook(list(self.parameters()), self.grad_norm)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.hidden(inputs.flatten(1)))
        psctl.log("active_fraction", (hidden > 0).float().mean())  # a one-element tensor
        return self.out(hidden)

    @staticmethod
    def grad_norm(grads: Sequence[torch.Tensor | None]) -> None:
        norms = [torch.linalg.vector_norm(g) for g in grads if g is not None]
        psctl.log("grad_norm", torch.linalg.vector_norm(torch.stack(norms)))


def build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return LoggedMLP(math.prod(input_shape), num_classes)
