"""Which model a run trains, and the shape of its parameters computed without torch.

The launcher and coordinator need the size of the key space before any worker has built a
model, and the CLI must not import torch; so the layouts of the built-in models live here as
plain arithmetic, and a test checks them against ``named_parameters()`` of the torch modules
that ``engine.models.build`` makes. A model from a user's file has no such arithmetic: its layout
is read from the module it builds (``engine.models.build.layout_of``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ConfigError
from engine.keys import KeyLayout, KeyRange, Segment
from engine.models.kinds import MODELS, SPARSE_ROWS, trains_sparse_rows
from engine.models.rows import rows_model
from engine.userfiles import FileRef, parse_file_ref

if TYPE_CHECKING:
    from engine.config import ModelConfig


def check_model(text: str) -> str:
    """A ``--model`` value made canonical: a registered name, or ``/abs/path.py:function``."""
    name = text.strip()
    if name.lower() in MODELS:
        return name.lower()
    ref = parse_file_ref(name, what="model", default_function="build")
    if ref is None:
        raise ConfigError(f"unknown model {text!r}: use {', '.join(MODELS.names())} or "
                          "path/to/file.py:build (a function build(input_shape, num_classes) "
                          "returning a torch.nn.Module)")
    return str(ref)


def model_file(model: str) -> FileRef | None:
    """The user file a canonical model name refers to, if any."""
    if model in MODELS:
        return None
    path, _, function = model.rpartition(":")
    return FileRef(Path(path), function)


def _weights(name: str, shape: tuple[int, ...], offset: int) -> list[Segment]:
    """A layer's weight of ``shape`` then its bias (one per output), from key ``offset``."""
    size = math.prod(shape)
    return [Segment(f"{name}.weight", shape, KeyRange(offset, offset + size)),
            Segment(f"{name}.bias", shape[:1], KeyRange(offset + size, offset + size + shape[0]))]


def _dense(name: str, fan_in: int, fan_out: int, offset: int) -> list[Segment]:
    return _weights(name, (fan_out, fan_in), offset)


@dataclass(frozen=True, slots=True)
class MLPSpec:
    """A fully connected ReLU network: input_dim -> hidden... -> num_classes. With no hidden
    layers it is multinomial logistic regression (``--model logreg``)."""

    input_dim: int
    hidden: tuple[int, ...]
    num_classes: int

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.input_dim, *self.hidden, self.num_classes)

    def segments(self) -> list[Segment]:
        """Weights then bias of each layer, in the order torch's ``named_parameters`` yields."""
        segments: list[Segment] = []
        for layer, (fan_in, fan_out) in enumerate(itertools.pairwise(self.widths)):
            segments += _dense(f"layers.{layer}", fan_in, fan_out,
                               segments[-1].keys.end if segments else 0)
        return segments

    def layout(self) -> KeyLayout:
        return KeyLayout(tuple(self.segments()))

    @property
    def num_keys(self) -> int:
        return self.segments()[-1].keys.end


@dataclass(frozen=True, slots=True)
class CNNSpec:
    """LeNet as Caffe trains it on MNIST: two 5x5 valid convolutions (20 and 50 channels), each
    followed by ReLU and 2x2 max pooling, a 500-unit ReLU layer, then the classes; with dropout
    (0.5) before the last layer, which Fashion-MNIST needs to pass 90 % (docs/models.md)."""

    input_shape: tuple[int, ...]
    num_classes: int
    channels: tuple[int, int] = (20, 50)
    kernel: int = 5
    hidden: int = 500
    dropout: float = 0.5

    def __post_init__(self) -> None:
        if len(self.input_shape) not in (2, 3):
            raise ConfigError(f"the cnn model takes images (channels, height, width); this data "
                              f"set's samples have shape {self.input_shape}: use --model mlp")
        if min(self.input_shape[-2:]) < 16:
            raise ConfigError(f"the cnn model needs images of at least 16x16; these are "
                              f"{self.input_shape[-2]}x{self.input_shape[-1]}: use --model mlp")

    @property
    def in_channels(self) -> int:
        return self.input_shape[0] if len(self.input_shape) == 3 else 1

    @property
    def flat_features(self) -> int:
        height, width = self.input_shape[-2:]
        for _ in self.channels:
            height, width = (height - self.kernel + 1) // 2, (width - self.kernel + 1) // 2
        return self.channels[-1] * height * width

    def segments(self) -> list[Segment]:
        segments: list[Segment] = []
        fan_in = self.in_channels
        for index, out in zip((0, 3), self.channels, strict=True):  # features.{0,3}: the convs
            segments += _weights(f"features.{index}", (out, fan_in, self.kernel, self.kernel),
                                 segments[-1].keys.end if segments else 0)
            fan_in = out
        segments += _dense("classifier.0", self.flat_features, self.hidden, segments[-1].keys.end)
        segments += _dense("classifier.3", self.hidden, self.num_classes, segments[-1].keys.end)
        return segments

    def layout(self) -> KeyLayout:
        return KeyLayout(tuple(self.segments()))


def builtin_layout(model: ModelConfig, input_shape: tuple[int, ...], num_classes: int, *,
                   sparse: bool = False) -> KeyLayout | None:
    """The layout of the registered model the run's ``model`` section names; None for a model
    from a user's file. On sparse samples the model is one of those that train on sparse rows
    (``engine.models.rows``): its keys over the data set's features, a worker's mini-batch
    pulling only its working set (``engine.worker.sparse``)."""
    input_dim = math.prod(input_shape)
    name = model.name
    if sparse:
        if not trains_sparse_rows(name) or num_classes != 2:
            raise ConfigError(f"sparse data sets train --model "
                              f"{' or '.join(MODELS.able(SPARSE_ROWS))} (binary), not {name}")
        return rows_model(model, input_dim).layout()
    if name not in MODELS:
        return None
    dense = MODELS.get(name).layout
    if dense is None:
        raise ConfigError(f"--model {name} trains sparse data sets (sparse-synthetic:...), not "
                          "dense samples")
    layout: KeyLayout = dense.load()(model.hidden, input_shape, num_classes)
    return layout


# What MODELS registers as each built-in model's layout (engine.models.kinds).
def mlp_layout(hidden: tuple[int, ...], shape: tuple[int, ...], classes: int) -> KeyLayout:
    return MLPSpec(math.prod(shape), hidden, classes).layout()


def cnn_layout(hidden: tuple[int, ...], shape: tuple[int, ...], classes: int) -> KeyLayout:
    return CNNSpec(shape, classes).layout()


def logreg_layout(hidden: tuple[int, ...], shape: tuple[int, ...], classes: int) -> KeyLayout:
    return MLPSpec(math.prod(shape), (), classes).layout()
