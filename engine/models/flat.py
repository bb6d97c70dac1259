"""The torch model, with every parameter and gradient a view into one flat float32 buffer.

Flat buffers let a worker pull straight into its parameters and push its gradient without
gathering tensors: the key space (``engine.models.build.layout_of``) is exactly the layout of
these buffers. On a GPU the module's parameters are views into a device copy of the buffers, and
values cross between host and device once per hop: the pulled values in before the forward pass,
the gradient out after the backward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from engine.config import ModelConfig
from engine.datasets.registry import DatasetSpec
from engine.keys import KeyLayout
from engine.models.build import MLP, build_module, layout_of, trainable
from engine.models.spec import MLPSpec

__all__ = ["MLP", "FlatModel", "ModelSeat", "evaluate", "refresh_buffers", "train_step",
           "train_step_np"]

# Layers whose forward reads no parameter but their own, so that a pre-hook on each of them
# runs before every read of every value (a custom module may read another's, or its own in a
# helper called before its forward): forward starts layer by layer only on these.
_SELF_CONTAINED = (nn.Linear, nn.Bilinear, nn.Embedding, nn.EmbeddingBag,
                   nn.modules.conv._ConvNd, nn.modules.batchnorm._NormBase, nn.LayerNorm,
                   nn.GroupNorm, nn.PReLU)


class FlatModel:
    """A model whose parameters and gradients live in two flat host buffers (numpy views given).

    ``FlatModel(spec, seed=...)`` builds the MLP ``spec`` describes; ``FlatModel.of(module)``
    takes any module (``engine.models.build.build_module``)."""

    def __init__(self, spec: MLPSpec, *, seed: int, device: str = "cpu") -> None:
        self._adopt(build_module("mlp", spec.hidden, (spec.input_dim,), spec.num_classes,
                                 seed=seed), device)

    @classmethod
    def of(cls, module: nn.Module, *, device: str = "cpu") -> FlatModel:
        model = cls.__new__(cls)
        model._adopt(module, device)
        return model

    @classmethod
    def for_run(cls, model: ModelConfig, data: DatasetSpec, *, seed: int,
                device: str = "cpu") -> FlatModel:
        """The model a run's settings name, for ``data``'s samples, on ``device``."""
        return cls.of(build_module(model.name, model.hidden, data.sample_shape,
                                   data.num_classes, seed=seed), device=device)

    @property
    def signature(self) -> str:
        """What the model's cost depends on: its class and parameter shapes."""
        shapes = ";".join(f"{s.name}{list(s.shape)}" for s in self.layout.segments)
        return f"{type(self.module).__name__}:{shapes}"

    def _adopt(self, module: nn.Module, device: str) -> None:
        self.device = torch.device(device)
        self.module = module.to(self.device)
        self.layout: KeyLayout = layout_of(module)
        self.num_keys = self.layout.num_keys
        self.params = torch.zeros(self.num_keys, dtype=torch.float32)
        self.grads = torch.zeros(self.num_keys, dtype=torch.float32)
        on_host = self.device.type == "cpu"
        # On the host the module trains in the buffers themselves; elsewhere in device copies.
        self._dparams = self.params if on_host else torch.zeros_like(self.params, device=device)
        self._dgrads = self.grads if on_host else torch.zeros_like(self.grads, device=device)
        for (_, parameter), segment in zip(trainable(module), self.layout.segments, strict=True):
            keys = slice(segment.keys.start, segment.keys.end)
            self.params[keys].copy_(parameter.detach().reshape(-1).cpu())
            parameter.data = self._dparams[keys].view(segment.shape)
            parameter.grad = self._dgrads[keys].view(segment.shape)
        self._dparams.copy_(self.params)
        self._values_watched = False
        self._arrived: set[int] = set()  # watched segments brought in for this forward pass

    @property
    def params_np(self) -> np.ndarray:
        return self.params.numpy()

    def initial_values(self) -> np.ndarray | None:
        """What worker 0 sends the servers to start from: every value, as initialised here."""
        return self.params_np

    @property
    def grads_np(self) -> np.ndarray:
        return self.grads.numpy()

    @property
    def on_host(self) -> bool:
        return self._dparams is self.params

    def zero_grad(self) -> None:
        self._dgrads.zero_()

    def values_to_device(self) -> None:
        """The pulled values (host buffer) into the module's parameters: one copy on a GPU.
        While ``watch_values`` is on, each layer's come in right before it runs instead."""
        if self._values_watched:
            self._arrived.clear()
        elif not self.on_host:
            self._dparams.copy_(self.params)

    def watch_values(self, need: Callable[[int], None]) -> Callable[[], None] | None:
        """Have each forward pass call ``need(i)`` right before the first layer that reads
        segment ``i`` runs (from a forward pre-hook; ``need`` returns once the values are in
        the host buffer), then bring them to the device. Returns what stops it, or None when a
        parameter belongs to a module that may read values outside its own forward (anything
        but the standard layers): the caller must then fill every value before forward."""
        index_of = {id(p): i for i, (_, p) in enumerate(trainable(self.module))}
        owners = [(m, [index_of[id(p)] for p in m.parameters(recurse=False) if id(p) in index_of])
                  for m in self.module.modules()]
        owners = [(module, indexes) for module, indexes in owners if indexes]
        if not all(isinstance(module, _SELF_CONTAINED) for module, _ in owners):
            return None
        handles = [module.register_forward_pre_hook(
            lambda _module, _args, indexes=indexes: self._bring_in(indexes, need))
            for module, indexes in owners]
        self._values_watched = True

        def stop() -> None:
            for handle in handles:
                handle.remove()
            self._values_watched = False
        return stop

    def _bring_in(self, indexes: list[int], need: Callable[[int], None]) -> None:
        for index in indexes:
            if index in self._arrived:  # a layer run twice, or a parameter two layers share
                continue
            need(index)
            if not self.on_host:
                keys = self.layout.segments[index].keys
                self._dparams[keys.start:keys.end].copy_(self.params[keys.start:keys.end])
            self._arrived.add(index)

    def gradient_to_host(self) -> None:
        """The gradient into the host buffer that is pushed: one copy on a GPU."""
        if not self.on_host:
            self.grads.copy_(self._dgrads)

    def watch_gradients(self, ready: Callable[[int], None]) -> Callable[[], None]:
        """Have backward call ``ready(i)`` as soon as segment ``i``'s gradient is complete in
        the host buffer (from an autograd post-accumulate hook, on the thread running backward;
        a parameter that the loss does not reach is never reported). Returns what stops it."""
        handles = [cast(Any, parameter).register_post_accumulate_grad_hook(  # untyped in torch
            lambda _, index=index: self._segment_ready(index, ready))
            for index, (_, parameter) in enumerate(trainable(self.module))]

        def stop() -> None:
            for handle in handles:
                handle.remove()
        return stop

    def _segment_ready(self, index: int, ready: Callable[[int], None]) -> None:
        self.segment_to_host(index)
        ready(index)

    def step(self, inputs: np.ndarray, targets: np.ndarray, *, to_host: bool = True) -> float:
        """One gradient of a numpy batch into ``grads``; the batch loss."""
        return train_step_np(self, inputs, targets, to_host=to_host)

    def segment_to_host(self, index: int) -> None:
        """Segment ``index``'s gradient into the host buffer (a copy on a GPU only)."""
        if not self.on_host:
            keys = self.layout.segments[index].keys
            self.grads[keys.start:keys.end].copy_(self._dgrads[keys.start:keys.end])


class ModelSeat:
    """One simulated worker's place at a model that every simulated worker shares: its own
    parameters (what it pulled) and gradient, computed on the shared torch model one worker at a
    time (its parameters are copied in first). What a worker loop reads of a ``FlatModel``."""

    def __init__(self, shared: FlatModel) -> None:
        self.shared = shared
        self.layout, self.num_keys = shared.layout, shared.num_keys
        self.params_np = shared.params_np.copy()
        self.grads_np = np.zeros_like(self.params_np)

    def initial_values(self) -> np.ndarray:
        return self.params_np

    def step(self, inputs: np.ndarray, targets: np.ndarray, *, to_host: bool = True) -> float:
        np.copyto(self.shared.params_np, self.params_np)
        loss = self.shared.step(inputs, targets)
        np.copyto(self.grads_np, self.shared.grads_np)
        return loss


def train_step(model: FlatModel, inputs: torch.Tensor, targets: torch.Tensor, *,
               to_host: bool = True) -> float:
    """Forward and backward; the gradient lands in ``model.grads`` (with ``to_host=False``, on
    a GPU, only where ``watch_gradients`` copied it). Returns the batch loss."""
    model.values_to_device()
    model.zero_grad()
    device = model.device
    loss = nn.functional.cross_entropy(model.module(inputs.to(device)), targets.to(device))
    cast(Any, loss).backward()  # torch's stubs leave backward untyped
    if to_host:
        model.gradient_to_host()
    return float(loss.detach())


def train_step_np(model: FlatModel, inputs: np.ndarray, targets: np.ndarray, *,
                  to_host: bool = True) -> float:
    """``train_step`` on numpy batches (shared memory, no copy)."""
    return train_step(model, torch.from_numpy(inputs), torch.from_numpy(targets),
                      to_host=to_host)


@torch.no_grad()
def evaluate(
    module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 4096
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) over the whole set, in eval mode (dropout off)."""
    device = _device_of(module)
    was_training = module.training
    module.eval()
    correct, loss_sum = 0, 0.0
    try:
        for start in range(0, len(inputs), batch_size):
            logits = module(inputs[start : start + batch_size].to(device))
            batch_targets = targets[start : start + batch_size].to(device)
            loss_sum += float(nn.functional.cross_entropy(logits, batch_targets, reduction="sum"))
            correct += int((logits.argmax(dim=1) == batch_targets).sum())
    finally:
        module.train(was_training)
    return correct / len(inputs), loss_sum / len(inputs)


# Batch norm's running statistics are not keys (docs/models.md): the evaluator, which never
# trains, estimates them afresh from this many training samples before each measurement.
REFRESH_SAMPLES = 2048


@torch.no_grad()
def refresh_buffers(module: nn.Module, inputs: torch.Tensor, batch_size: int = 256) -> bool:
    """Re-estimate every batch-norm layer's running mean and variance on ``inputs`` (a fixed
    sample of the training set) with the current parameters; False when there are none."""
    norms = [m for m in module.modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms or not len(inputs):
        return False
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches below
    device, was_training = _device_of(module), module.training
    module.train()
    try:
        for start in range(0, min(len(inputs), REFRESH_SAMPLES), batch_size):
            module(inputs[start : start + batch_size].to(device))
    finally:
        module.train(was_training)
        for norm, momentum in zip(norms, momenta, strict=True):
            norm.momentum = momentum
    return True


def calibration_sample(model: FlatModel, inputs: np.ndarray, seed: int) -> torch.Tensor | None:
    """A fixed random sample of training ``inputs`` to refresh ``model``'s batch-norm statistics
    from, or None when it has none to refresh."""
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.module.modules()):
        return None
    chosen = np.random.default_rng(seed).permutation(len(inputs))[:REFRESH_SAMPLES]
    return torch.from_numpy(inputs[np.sort(chosen)])


def _device_of(module: nn.Module) -> torch.device:
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")
