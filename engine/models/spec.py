"""The shape of a model's parameters, computed without torch.

The launcher and coordinator need the size of the key space before any worker has built a
model, and the CLI must not import torch; so the layout lives here as plain arithmetic and the
torch model (``engine.models.flat``) is built from it. A test checks the two agree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from engine.keys import KeyLayout, KeyRange, Segment


@dataclass(frozen=True, slots=True)
class MLPSpec:
    """A fully connected ReLU network: input_dim -> hidden... -> num_classes."""

    input_dim: int
    hidden: tuple[int, ...]
    num_classes: int

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.input_dim, *self.hidden, self.num_classes)

    def segments(self) -> list[Segment]:
        """Weights then bias of each layer, in the order torch's ``named_parameters`` yields."""
        segments, offset = [], 0
        for layer, (fan_in, fan_out) in enumerate(itertools.pairwise(self.widths)):
            for name, shape in (
                (f"layers.{layer}.weight", (fan_out, fan_in)),
                (f"layers.{layer}.bias", (fan_out,)),
            ):
                size = 1
                for dim in shape:
                    size *= dim
                segments.append(Segment(name, shape, KeyRange(offset, offset + size)))
                offset += size
        return segments

    def layout(self) -> KeyLayout:
        return KeyLayout(tuple(self.segments()))

    @property
    def num_keys(self) -> int:
        return self.segments()[-1].keys.end
