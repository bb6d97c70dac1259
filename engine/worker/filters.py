"""Gradient push filters: which entries of a worker's gradient are worth sending (issue 15, part 1).

A filter sits between the worker's flat gradient and ``ParameterClient.push``: it turns the dense
gradient into sorted global keys and their values, layer by layer, so the push travels as a sparse
frame. The *rule* decides, per layer, which entries to send (seed 002's thresholds: top-k share,
k standard deviations, the dynamic threshold); the *filter* owns everything that outlives one
call: the per-layer rule state, the error-feedback residual and the momentum-correction buffers.

Error feedback (on by default) adds what was not sent to the next gradient, so pruning delays
updates instead of losing them. Momentum correction is Deep Gradient Compression's (Lin et al.,
ICLR 2018): the worker keeps the momentum, so the servers should then run plain SGD.

This module is imported by the config and CLI layers to list and check ``--prune`` specs, so it
must not import torch at module level: torch is imported inside the methods that compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Protocol

import numpy as np

from engine.errors import ConfigError
from engine.keys import KeyRange
from engine.registry import Registry

if TYPE_CHECKING:  # the config layer lists the rules without paying for torch
    import torch

    from engine.config import CommConfig


@dataclass(slots=True)
class LayerState:
    """What a rule remembers about one layer between calls; the filter owns one per layer, so
    the rules themselves stay immutable values that can be compared, printed and stored."""

    threshold: torch.Tensor | None = None  # the cut applied at the last call (a 0-d tensor)
    carried: torch.Tensor | None = None  # dynamic: the cut to apply at the next call


class PruneRule(Protocol):
    """Chooses which entries of one layer's (error-corrected) gradient are sent."""

    @property
    def spec(self) -> str:
        """The ``--prune`` text that ``parse_prune`` turns back into an equal rule."""
        ...

    def select(self, values: torch.Tensor, state: LayerState) -> torch.Tensor:
        """Sorted int64 indices into ``values`` (1-d float32, non-empty) of the entries to send;
        records the cut it applied in ``state.threshold``."""
        ...


def _indices(mask: torch.Tensor) -> torch.Tensor:
    """The positions of ``mask``'s true entries: int64 and ascending, as torch guarantees."""
    import torch

    return torch.nonzero(mask, as_tuple=True)[0]


def _decimal_text(number: float, scale: int = 1) -> str:
    """``number · scale`` as the shortest plain decimal (``2.0`` → ``2``, ``0.07``, 100 →
    ``7``), exact in decimal so that a spec round-trips through ``parse_prune``."""
    return format((Decimal(repr(number)) * scale).normalize(), "f")


@dataclass(frozen=True, slots=True)
class TopK:
    """The ceil(fraction · n) entries of a layer that are largest in |g|; at least one.

    The count is computed from the decimal the fraction was written as, so ``topk:7%`` of 100
    entries is 7, not the 8 that 0.07 · 100 = 7.000000000000001 would round up to. Ties at the
    cut are broken towards the lower index, so the selection does not depend on the device."""

    fraction: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fraction) and 0.0 < self.fraction <= 1.0):
            raise ConfigError(f"top-k needs a share in (0 %, 100 %], got {self.fraction!r}")

    @property
    def spec(self) -> str:
        return f"topk:{_decimal_text(self.fraction, scale=100)}%"

    def count(self, size: int) -> int:
        """How many of ``size`` entries are sent."""
        return max(1, min(size, math.ceil(Decimal(repr(self.fraction)) * size)))

    def select(self, values: torch.Tensor, state: LayerState) -> torch.Tensor:
        import torch

        keep = self.count(values.numel())
        magnitude = values.abs()
        cut = torch.topk(magnitude, keep, sorted=False).values.min()
        chosen = magnitude > cut
        # The places left go to the lowest-index ties (usually the cut itself); the syncs this
        # costs on a GPU are paid by nonzero anyway, and it is cheaper than a cumsum.
        ties = _indices(magnitude == cut)
        chosen[ties[:keep - int(chosen.sum())]] = True
        state.threshold = cut
        return _indices(chosen)


@dataclass(frozen=True, slots=True)
class Sigma:
    """The entries with |g| > k·sigma, sigma the *population* standard deviation (divide by n)
    of the layer's signed values about their mean.

    Population, not sample: sigma describes this layer's values rather than estimating a wider
    distribution, and it stays defined for a one-entry layer (sigma = 0: a nonzero entry is sent).
    Like every scale-free threshold, a layer whose values are all about equally large may send
    nothing for a long time; error feedback keeps those entries, it does not force them out."""

    k: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and self.k > 0.0):
            raise ConfigError(f"the sigma multiple must be a positive number, got {self.k!r}")

    @property
    def spec(self) -> str:
        return f"sigma:{_decimal_text(self.k)}"

    def select(self, values: torch.Tensor, state: LayerState) -> torch.Tensor:
        import torch

        cut = self.k * torch.std(values, correction=0)
        state.threshold = cut
        return _indices(values.abs() > cut)


@dataclass(frozen=True, slots=True)
class Dynamic:
    """Seed 002's dynamic threshold: the next threshold is the mean |g| of the entries above the
    current one.

    Per layer: the first call (and any restart) uses the mean |g| of the layer's values as its
    threshold; the entries with |g| strictly above the threshold are sent, and the mean |g| of
    those entries becomes the threshold of the next call. The magnitudes are those of the
    error-corrected values the filter hands in. Since a mean of values above t exceeds t, the
    threshold only climbs while the gradients keep their scale; when a call finds no entry above
    its carried threshold, the rule restarts in that same call from the mean |g|, so no call is
    silently empty. If even the mean lets nothing through, every magnitude is equal (say, a
    one-entry layer): then the nonzero entries are sent, as there is nothing to rank them by."""

    @property
    def spec(self) -> str:
        return "dynamic"

    def select(self, values: torch.Tensor, state: LayerState) -> torch.Tensor:
        magnitude = values.abs()
        cut = state.carried
        chosen = None if cut is None else magnitude > cut
        if chosen is None or not bool(chosen.any()):  # the first call, or a restart
            cut = magnitude.mean()
            chosen = magnitude > cut
            if not bool(chosen.any()):
                chosen = magnitude > 0
        picked = _indices(chosen)
        state.threshold = cut
        state.carried = magnitude[picked].mean() if picked.numel() else None
        return picked


@dataclass(frozen=True, slots=True)
class NoPrune:
    """Every entry: the dense baseline, through the same code path as the pruned runs."""

    @property
    def spec(self) -> str:
        return "none"

    def select(self, values: torch.Tensor, state: LayerState) -> torch.Tensor:
        import torch

        state.threshold = None
        return torch.arange(values.numel(), dtype=torch.int64, device=values.device)


# -- parsing ``--prune`` specs (pure python: the config layer validates with it) ----------------


@dataclass(frozen=True, slots=True)
class RuleSyntax:
    """How a rule is written and how its argument (the text after ``:``, if any) is read."""

    form: str
    build: Callable[[str | None], PruneRule]


def _number(text: str | None, what: str) -> Decimal:
    if not text:
        raise ConfigError(f"{what} is missing")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ConfigError(f"{what} {text!r} is not a number") from None
    if not number.is_finite():
        raise ConfigError(f"{what} must be finite, got {text!r}")
    return number


def _build_topk(argument: str | None) -> PruneRule:
    percent = argument is not None and argument.endswith("%")
    text = argument[:-1] if argument is not None and percent else argument
    share = _number(text, "the share")
    fraction = share / 100 if percent else share
    if not percent and fraction > 1:
        raise ConfigError(f"a bare share must lie in (0, 1] (did you mean {argument}%?)")
    if not (0 < fraction <= 1) or float(fraction) == 0.0:
        raise ConfigError("the share must lie in (0 %, 100 %]")
    return TopK(float(fraction))


def _build_sigma(argument: str | None) -> PruneRule:
    multiple = _number(argument, "the sigma multiple")
    if multiple <= 0:
        raise ConfigError("the sigma multiple must be positive")
    return Sigma(float(multiple))


def _no_argument(rule: PruneRule) -> Callable[[str | None], PruneRule]:
    def build(argument: str | None) -> PruneRule:
        if argument is not None:
            raise ConfigError(f"{rule.spec} takes no argument")
        return rule

    return build


PRUNE_RULES: Registry[RuleSyntax] = Registry("prune rule")
PRUNE_RULES.register("topk", RuleSyntax("topk:P% (e.g. topk:1%) or topk:FRACTION", _build_topk),
                     "send the P % of each layer's entries that are largest in |g|")
PRUNE_RULES.register("sigma", RuleSyntax("sigma:K (e.g. sigma:2)", _build_sigma),
                     "send the entries with |g| above K standard deviations of their layer")
PRUNE_RULES.register("dynamic", RuleSyntax("dynamic", _no_argument(Dynamic())),
                     "per layer, send |g| above a threshold that becomes the mean of what passed")
PRUNE_RULES.register("none", RuleSyntax("none", _no_argument(NoPrune())),
                     "send every entry (dense)")


def prune_forms() -> str:
    """Every accepted way to write a rule, for error messages and ``--help``."""
    return ", ".join(PRUNE_RULES.get(name).form for name in PRUNE_RULES.names())


def parse_prune(spec: str) -> PruneRule:
    """``"topk:1%"``, ``"topk:0.01"``, ``"sigma:2"``, ``"dynamic"`` or ``"none"`` as a rule;
    anything else is a ``ConfigError`` whose one line says what to write instead."""
    name, colon, argument = spec.strip().partition(":")
    try:
        if name not in PRUNE_RULES:
            raise ConfigError(f"unknown rule {name!r}" if name else "no rule given")
        return PRUNE_RULES.get(name).build(argument if colon else None)
    except ConfigError as error:
        raise ConfigError(f"prune rule {spec!r}: {error}; write {prune_forms()}") from None


# -- the per-worker filter ----------------------------------------------------------------------


WARMUP_BASE = 0.25  # DGC's warm-up: the share sent falls by 4x an epoch (Lin et al., ICLR 2018)


def _check_tiling(segments: Sequence[KeyRange], num_keys: int) -> None:
    """A key outside every segment would never be sent yet never be dropped: refuse it."""
    end = 0
    for segment in segments:
        if segment.start != end:
            raise ConfigError(f"filter segment [{segment.start}, {segment.end}) does not "
                              f"follow on from key {end}")
        end = segment.end
    if end != num_keys:
        raise ConfigError(f"the filter's segments cover {end} keys, the model has {num_keys}")


def _check_momentum(momentum: float, error_feedback: bool) -> None:
    if not (math.isfinite(momentum) and 0.0 <= momentum < 1.0):
        raise ConfigError(f"momentum correction needs 0 <= momentum < 1, got {momentum!r}")
    if momentum > 0.0 and not error_feedback:
        raise ConfigError("momentum correction accumulates what was not sent: it needs error "
                          "feedback (drop --no-error-feedback or set the momentum to 0)")


class GradientFilter:
    """One worker's push filter: per call, the keys and values to send for a flat gradient.

    With error feedback the rule sees ``acc = residual + g``; ``acc[sent]`` is sent and the
    residual becomes ``acc`` with the sent entries zeroed, so the sum of everything sent plus
    the residual always equals the sum of all gradients. With ``momentum`` m > 0 (DGC momentum
    correction) the filter keeps a momentum ``u ← m·u + g`` and accumulates ``v ← v + u``;
    the rule sees ``v``, ``v[sent]`` is sent, and both ``u`` and ``v`` are zeroed at the sent
    entries (momentum factor masking), so sent plus residual ``v`` equals the sum of the ``u``
    after each update. Without error feedback the unsent entries are dropped.

    The work is torch, on ``device`` (a GPU when the worker has one), one rule call per layer;
    on the CPU the caller's array is read in place, never written."""

    def __init__(self, rule: PruneRule, segments: Sequence[KeyRange], num_keys: int, *,
                 error_feedback: bool = True, momentum: float = 0.0,
                 clip_norm: float | None = None, warmup_epochs: int = 0,
                 device: str | torch.device = "cpu") -> None:
        import torch

        _check_tiling(segments, num_keys)
        _check_momentum(momentum, error_feedback)
        self.final_rule = self.rule = rule
        self.clip_norm = clip_norm  # DGC's local clipping threshold, already / sqrt(workers)
        self.warmup_epochs = warmup_epochs
        self.segments = tuple(segments)
        self.total_keys = num_keys
        self.error_feedback = error_feedback
        self.momentum = momentum
        self.device = torch.device(device)
        self.sent_keys = 0  # keys sent by the last call
        self._states = [LayerState() for _ in self.segments]
        self._residual = self._zeros() if error_feedback else None  # DGC's v
        self._velocity = self._zeros() if momentum > 0.0 else None  # DGC's u, the momentum

    @property
    def residual(self) -> np.ndarray:
        """A copy of what is still waiting to be sent (all zero without error feedback)."""
        if self._residual is None:
            return np.zeros(self.total_keys, dtype=np.float32)
        return self._residual.to("cpu", copy=True).numpy()

    @property
    def thresholds(self) -> list[float | None]:
        """Per layer, the cut the rule applied at its last call (top-k: the k-th largest |g|;
        sigma: k·sigma; dynamic: its threshold); None where there is none or no call yet."""
        return [None if s.threshold is None else float(s.threshold) for s in self._states]

    def start_epoch(self, epoch: int) -> None:
        """DGC's warm-up: in epoch e < ``warmup_epochs`` a top-k rule sends the share
        0.25^(e + 1) (75 %, 93.75 %, 98.4375 %, ... sparsity, as Lin et al.) while that is
        above its own; afterwards, and for the other rules, the rule as given."""
        rule = self.final_rule
        if isinstance(rule, TopK) and epoch < self.warmup_epochs:
            self.rule = TopK(max(rule.fraction, WARMUP_BASE ** (epoch + 1)))
        else:
            self.rule = rule

    def apply(self, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted unique int64 global keys, their float32 values) to push for ``grad``."""
        candidate = self._accumulate(self._clipped(self._tensor(grad)))
        keys = self._select(candidate)
        values = candidate[keys]  # a gather: a copy, unaffected by the masking below
        for buffer in (self._residual, self._velocity):
            if buffer is not None:
                buffer.index_fill_(0, keys, 0.0)
        self.sent_keys = int(keys.numel())
        return keys.cpu().numpy(), values.cpu().numpy()

    def _zeros(self) -> torch.Tensor:
        import torch

        return torch.zeros(self.total_keys, dtype=torch.float32, device=self.device)

    def _tensor(self, grad: np.ndarray) -> torch.Tensor:
        import torch

        if grad.shape != (self.total_keys,):
            raise ConfigError(f"a gradient of shape {grad.shape} for a filter built for "
                              f"{self.total_keys} keys")
        array = np.ascontiguousarray(grad, dtype=np.float32)
        if not array.flags.writeable:  # torch warns on read-only memory; we never write it
            array = array.copy()
        return torch.from_numpy(array).to(self.device)

    def _clipped(self, grad: torch.Tensor) -> torch.Tensor:
        """DGC's local gradient clipping, before the gradient joins the accumulation: scaled
        down to L2 norm ``clip_norm`` where it is longer (a copy; the caller's array is kept)."""
        if self.clip_norm is None:
            return grad
        norm = float(grad.norm())
        return grad * (self.clip_norm / norm) if norm > self.clip_norm else grad

    def _accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        """What the rule selects on: the raw gradient, ``residual + g``, or DGC's ``v``."""
        if self._velocity is not None and self._residual is not None:
            self._velocity.mul_(self.momentum).add_(grad)
            return self._residual.add_(self._velocity)
        if self._residual is not None:
            return self._residual.add_(grad)
        return grad

    def _select(self, candidate: torch.Tensor) -> torch.Tensor:
        import torch

        parts = [self.rule.select(candidate[s.start:s.end], state) + s.start
                 for s, state in zip(self.segments, self._states, strict=True) if len(s)]
        if not parts:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        return torch.cat(parts)


def warmup_fits(config: CommConfig) -> None:
    """DGC's warm-up lowers a top-k share epoch by epoch: the other rules have no share."""
    if config.warmup_epochs and not isinstance(parse_prune(config.prune), TopK):
        raise ValueError(f"comm.warmup_epochs (--prune-warmup) lowers a top-k share epoch by "
                         f"epoch: it needs --prune topk:P%, not {config.prune}")


def make_filter(config: CommConfig, segments: Sequence[KeyRange], num_keys: int,
                workers: int = 1) -> GradientFilter | None:
    """The worker's push filter for the run's ``[comm]`` settings; None pushes dense. DGC's
    local clipping threshold is scaled by workers^(-1/2), as Lin et al. scale it."""
    rule = parse_prune(config.prune)
    if isinstance(rule, NoPrune) and not (config.momentum_correction or config.local_clip):
        return None
    clip = None if config.local_clip is None else config.local_clip / math.sqrt(workers)
    return GradientFilter(rule, segments, num_keys, error_feedback=config.error_feedback,
                          momentum=config.momentum_correction, clip_norm=clip,
                          warmup_epochs=config.warmup_epochs)
