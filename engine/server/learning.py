"""How large a step each update takes: learning-rate schedules and staleness-aware rules.

Both give a factor that multiplies the optimizer's learning rate for one update (the
``scale`` of ``ServerOptimizer.apply``); they never touch the gradient itself, so a rule means
the same for SGD as for Adam, whose step does not grow with the gradient's size.

- A **schedule** depends on the shard's update count for the clock ranges an update touches
  (the number of updates those keys have received): warm-up, step decay, cosine. Indexed by
  epoch instead (``learning.unit = "epochs"``), it depends on the clock of the push (a BSP
  round: of the push that completed it): the pushing worker's epoch, exact to the iteration.
- A **staleness rule** depends on the push: its staleness τ (updates applied to its keys
  since the pull its gradient was computed on, the same number the worker records) and its
  worker. Rules apply to pushes applied on arrival (asp, ssp, dssp, bounded delay); a BSP
  round's mean has τ = 0 and gets the schedule alone.

A rule's factor is relative to the aggregator's own scaling (``sync.push_scale``: the mean
divides each asynchronous push by the number of workers), so that ``none`` is exactly the
behaviour without rules, and a rule's global rate λ is the whole multiplier a push gets:
λ = 1/workers by default, as the mean. docs/learning.md gives every formula and its source.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.config import LearningConfig
from engine.errors import ConfigError
from engine.policies.learning import (
    SCHEDULES,
    STALENESS_RULES,
    RuleContext,
    Schedule,
    StalenessRule,
)
from engine.server.update import Update


@dataclass(frozen=True)
class Constant:
    def factor(self, step: float) -> float:
        return 1.0


@dataclass(frozen=True)
class StepDecay:
    """Multiplied by gamma every ``every`` updates (torch.optim.lr_scheduler.StepLR)."""

    every: float
    gamma: float

    def factor(self, step: float) -> float:
        return float(self.gamma ** (step // self.every))


@dataclass(frozen=True)
class Cosine:
    """From 1 down to ``floor`` over ``total`` updates along half a cosine, then ``floor``
    (torch.optim.lr_scheduler.CosineAnnealingLR with eta_min = floor * lr)."""

    total: float
    floor: float = 0.0

    def factor(self, step: float) -> float:
        progress = min(step, self.total) / self.total
        return self.floor + (1 - self.floor) * (1 + math.cos(math.pi * progress)) / 2


@dataclass(frozen=True)
class WarmUp:
    """Linear warm-up over ``updates`` (from 1/updates up to 1), then ``then``'s factor counted
    from the end of the warm-up."""

    updates: float
    then: Schedule

    def factor(self, step: float) -> float:
        if step < self.updates:
            return (step + 1) / self.updates
        return self.then.factor(step - self.updates)


def build_step(config: LearningConfig, per: float) -> Schedule:
    if config.step_every is None:
        raise ConfigError("learning.schedule step needs learning.step_every (updates per decay)")
    return StepDecay(config.step_every * per, config.gamma)


def build_cosine(config: LearningConfig, per: float) -> Schedule:
    if config.total is None:
        raise ConfigError("learning.schedule cosine needs learning.total (updates to anneal over)")
    return Cosine(config.total * per, config.floor)


def build_constant(config: LearningConfig, per: float) -> Schedule:
    return Constant()


def make_schedule(config: LearningConfig, per: float = 1.0) -> Schedule:
    """The schedule over steps, its settings counted in units of ``per`` steps: 1 for
    updates, a worker's clocks per epoch for epochs (so that an epoch-indexed schedule is an
    exact schedule over the pushing worker's clock)."""
    schedule = SCHEDULES.get(config.schedule)(config, per)
    return WarmUp(config.warmup * per, schedule) if config.warmup else schedule


# -- staleness-aware rules --------------------------------------------------------------------


@dataclass(frozen=True)
class NoRule:
    def factor(self, worker: int, staleness: int, update: Update) -> float:
        return 1.0


@dataclass(frozen=True)
class ConSGD:
    """CONSGD (seed 000): a constant global rate λ multiplies every local update."""

    relative: float  # λ times the aggregator's divisor: 1 when λ is the mean's 1/workers

    def factor(self, worker: int, staleness: int, update: Update) -> float:
        return self.relative


@dataclass(frozen=True)
class DynSGD:
    """DynSGD (Jiang et al., SIGMOD 2017): a push τ updates stale counts 1/(τ + 1)."""

    relative: float

    def factor(self, worker: int, staleness: int, update: Update) -> float:
        return self.relative / (staleness + 1)


class DynSSGC:
    """DYNSSGC (seed 000): the server sets the global rate from the maximum staleness: here
    λ / (τ_max + 1), τ_max over this shard's last ``window`` pushes, this one included."""

    def __init__(self, relative: float, window: int) -> None:
        self.relative = relative
        self._recent: deque[int] = deque(maxlen=window)

    def factor(self, worker: int, staleness: int, update: Update) -> float:
        self._recent.append(staleness)
        return self.relative / (max(self._recent) + 1)


def _norm(values: np.ndarray) -> float:
    """The L2 norm in float64: a float32 sum of squares loses digits over 10^5 keys."""
    wide = values if values.dtype == np.float64 else values.astype(np.float64)
    return math.sqrt(float(wide @ wide))


class PerWorkerAdaptive:
    """The per-worker adaptive rate (seed 000): w += η / sqrt(Σ_{i≤t+1} g_i²) · g_{t+1}, with
    the sum over the pushes of the pushing worker only, so a worker that has pushed less keeps
    a larger rate. Our reading: g_i is one push of that worker to this shard and g_i² its squared
    L2 norm (a scalar, as the slide writes it), kept per worker on each shard."""

    def __init__(self, relative: float, workers: int, divisor: int) -> None:
        self.relative, self.divisor = relative, divisor
        self.squares = np.zeros(workers, dtype=np.float64)

    def factor(self, worker: int, staleness: int, update: Update) -> float:
        # The norms of the pushed gradients, before the aggregator divided them: a push then
        # moves the parameters by lr * λ * g / sqrt(Σ |g_i|²), as the formula says.
        self.squares[worker] += (self.divisor * _norm(update.values)) ** 2
        total = float(self.squares[worker])
        return self.relative / math.sqrt(total) if total > 0 else 0.0


class SplitGradients:
    """Gradient splitting (seed 000): each worker's latest gradient g_c is a direction
    g_c/|g_c| and a distance |g_c|; at every push the server finds t with

        t * |sum_c alpha_c g_c/|g_c|| = |sum_c g_c|

    over the latest gradients of all workers on this shard, and applies the pushed gradient
    with distance t * alpha_c: the sum of the latest gradients keeps its length. The slide does
    not define alpha_c: psctl takes alpha_c = 1 for every worker (equal distances, the only
    reading that adds nothing to the slide; issue 40 dropped an earlier staleness weight); a
    worker that has not pushed yet has no g_c and is left out. A worker's latest gradient is
    per key: a push replaces the keys it carries (a layer-by-layer push, its layer's keys).
    """

    # The running sums drift by rounding as pushes add and remove their parts; recomputing
    # them from the latest gradients this often keeps them exact at a small cost.
    REFRESH_EVERY = 512

    def __init__(self, relative: float, workers: int, size: int) -> None:
        self.relative = relative
        self.latest = np.zeros((workers, size), dtype=np.float32)
        self.weights = np.zeros(workers, dtype=np.float64)  # alpha_c: 1 once the worker pushed
        # Kept up to date push by push, so that a push costs O(shard), not O(workers * shard):
        self._squares = np.zeros(workers, dtype=np.float64)  # |g_c|^2
        self._sum = np.zeros(size, dtype=np.float64)  # sum_c g_c
        self._directions = np.zeros(size, dtype=np.float64)  # sum_c alpha_c g_c / |g_c|
        self._pushes = 0

    def factor(self, worker: int, staleness: int, update: Update) -> float:
        row = self.latest[worker]
        keys: slice | np.ndarray = update.span if update.index is None else update.index
        old = row[keys].astype(np.float64)
        new = update.values.astype(np.float64)
        self._directions -= self._coefficient(worker) * row  # this worker's old direction out
        row[keys] = update.values
        self._squares[worker] = max(0.0, self._squares[worker] + float(new @ new - old @ old))
        self._sum[keys] += new - old
        self.weights[worker] = 1.0  # alpha_c: equal distances
        self._directions += self._coefficient(worker) * row  # and its new one in
        self._pushes += 1
        if self._pushes % self.REFRESH_EVERY == 0:
            self._refresh()
        own = math.sqrt(self._squares[worker])
        return self.relative * self.distance() * self.weights[worker] / own if own > 0 else 0.0

    def _coefficient(self, worker: int) -> float:
        squares = self._squares[worker]
        return float(self.weights[worker] / math.sqrt(squares)) if squares > 0 else 0.0

    def _refresh(self) -> None:
        """Recompute the running sums exactly from the latest gradients."""
        latest = self.latest.astype(np.float64)
        self._squares = np.einsum("ij,ij->i", latest, latest)
        self._sum = latest.sum(axis=0)
        self._directions = np.zeros_like(self._sum)
        for worker in range(len(latest)):
            self._directions += self._coefficient(worker) * latest[worker]

    def distance(self) -> float:
        """t, from the latest gradients and weights (0 when every gradient is zero)."""
        combined = _norm(self._directions)
        return _norm(self._sum) / combined if combined > 0 else 0.0


def build_no_rule(context: RuleContext) -> StalenessRule:
    return NoRule()


def build_consgd(context: RuleContext) -> StalenessRule:
    return ConSGD(context.relative)


def build_dynsgd(context: RuleContext) -> StalenessRule:
    return DynSGD(context.relative)


def build_dynssgc(context: RuleContext) -> StalenessRule:
    return DynSSGC(context.relative, context.config.window or 2 * context.workers)


def build_adaptive(context: RuleContext) -> StalenessRule:
    return PerWorkerAdaptive(context.relative, context.workers, context.divisor)


def build_split(context: RuleContext) -> StalenessRule:
    return SplitGradients(context.relative, context.workers, context.size)


def make_rule(config: LearningConfig, workers: int, divisor: int, size: int) -> StalenessRule:
    return STALENESS_RULES.get(config.rule)(RuleContext(config, workers, divisor, size))


class Learning:
    """A shard's schedule and staleness rule together.

    With ``by_epoch`` settings the schedule is indexed by the clock of the push instead of the
    update count, its settings counted in epochs; until ``start`` says how many clocks an epoch
    has (the coordinator sends it before any worker starts) it counts one clock per epoch."""

    def __init__(self, schedule: Schedule, rule: StalenessRule, *,
                 by_epoch: LearningConfig | None = None) -> None:
        self.schedule, self.rule = schedule, rule
        self._by_epoch = by_epoch
        self.clocks_per_epoch: float | None = None

    @property
    def by_epoch(self) -> bool:
        return self._by_epoch is not None

    def start(self, clocks_per_epoch: float) -> None:
        """Training starts with ``clocks_per_epoch`` clocks (pushes) per worker per epoch."""
        if clocks_per_epoch <= 0 or not math.isfinite(clocks_per_epoch):
            raise ConfigError(f"clocks per epoch must be positive, got {clocks_per_epoch}")
        self.clocks_per_epoch = clocks_per_epoch
        if self._by_epoch is not None:
            self.schedule = make_schedule(self._by_epoch, clocks_per_epoch)

    def scale(self, step: int, push: tuple[int, int, Update] | None = None, *,
              clock: int = 0) -> float:
        """The factor of an update after ``step`` earlier ones on its keys (by epoch: of a push
        of ``clock``); ``push`` is the (worker, staleness, update) of a push applied on
        arrival, None for a BSP round's mean."""
        factor = self.schedule.factor(clock if self.by_epoch else step)
        if push is not None:
            factor *= self.rule.factor(*push)
        return factor


def make_learning(config: LearningConfig, workers: int, divisor: int, size: int) -> Learning:
    """A shard's learning policies from the run's settings."""
    epochs = config if config.unit == "epochs" else None
    return Learning(make_schedule(config), make_rule(config, workers, divisor, size),
                    by_epoch=epochs)


PLAIN = Learning(Constant(), NoRule())
