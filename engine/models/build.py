"""One builder for every process that needs the model: workers, the evaluator, the simulator,
and the coordinator when the model comes from a user's file.

``build(input_shape, num_classes) -> torch.nn.Module`` is the whole contract of a model file. The
key layout is the module's trainable parameters in ``named_parameters()`` order; buffers (batch
norm's running statistics) are never keys: each process keeps its own, and the evaluator
re-estimates them from training batches before it measures (``engine.models.flat.refresh_buffers``).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from engine.errors import ConfigError
from engine.keys import KeyLayout, KeyRange, Segment
from engine.models.kinds import MODELS
from engine.models.spec import CNNSpec, MLPSpec, model_file
from engine.userfiles import FileRef, call_user_function


class MLP(nn.Module):
    def __init__(self, spec: MLPSpec) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(fan_in, fan_out) for fan_in, fan_out in itertools.pairwise(spec.widths)
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = inputs.flatten(1)  # data sets keep their sample shape; an MLP wants vectors
        for layer in self.layers[:-1]:
            hidden = torch.relu(layer(hidden))
        logits: torch.Tensor = self.layers[-1](hidden)
        return logits


class CNN(nn.Module):
    """``engine.models.spec.CNNSpec`` as torch layers (the names match its segments)."""

    def __init__(self, spec: CNNSpec) -> None:
        super().__init__()
        (first, second), kernel = spec.channels, spec.kernel
        self.features = nn.Sequential(
            nn.Conv2d(spec.in_channels, first, kernel), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(first, second, kernel), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(spec.flat_features, spec.hidden), nn.ReLU(), nn.Dropout(spec.dropout),
            nn.Linear(spec.hidden, spec.num_classes))
        self.image_shape = (spec.in_channels, *spec.input_shape[-2:])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(inputs.view(-1, *self.image_shape)))
        return logits


def build_module(model: str, hidden: tuple[int, ...], input_shape: tuple[int, ...],
                 num_classes: int, *, seed: int) -> nn.Module:
    """The model a run trains, its initial values drawn from ``seed`` (so every process that
    builds it holds the same values)."""
    torch.manual_seed(seed)
    if model in MODELS:
        module = MODELS.get(model).module
        if module is None:  # refused before any process starts (engine.models.spec)
            raise ConfigError(f"--model {model} has no torch module: it trains sparse data sets")
        built: nn.Module = module.load()(hidden, input_shape, num_classes)
        return built
    ref = model_file(model)
    assert ref is not None
    return _from_file(ref, input_shape, num_classes)


# What MODELS registers as each built-in model's module (engine.models.spec).
def mlp(hidden: tuple[int, ...], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MLP(MLPSpec(math.prod(input_shape), hidden, num_classes))


def logreg(hidden: tuple[int, ...], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MLP(MLPSpec(math.prod(input_shape), (), num_classes))


def cnn(hidden: tuple[int, ...], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return CNN(CNNSpec(input_shape, num_classes))


def layout_of(module: nn.Module) -> KeyLayout:
    """The key layout of ``module``: its trainable parameters in ``named_parameters()`` order."""
    segments: list[Segment] = []
    for name, parameter in trainable(module):
        start = segments[-1].keys.end if segments else 0
        segments.append(Segment(name, tuple(parameter.shape),
                                KeyRange(start, start + parameter.numel())))
    if not segments:
        raise ConfigError("the model has no trainable parameters: nothing to train")
    return KeyLayout(tuple(segments))


def trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def _from_file(ref: FileRef, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    module = call_user_function(str(ref), tuple(input_shape), num_classes, what="model")
    if not isinstance(module, nn.Module):
        raise ConfigError(f"model {ref}: {ref.function} returned {type(module).__name__}, "
                          "not a torch.nn.Module")
    bad = [name for name, p in trainable(module) if p.dtype != torch.float32]
    if bad:
        raise ConfigError(f"model {ref}: parameters must be float32; {', '.join(bad[:3])} are "
                          "not (the servers hold float32 values)")
    return module
