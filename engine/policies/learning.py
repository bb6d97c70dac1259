"""Learning-rate schedules (``--lr-schedule``, config ``learning.schedule``) and staleness-aware
rules (``--lr-rule``, config ``learning.rule``). Implementations: ``engine.server.learning``;
formulas: docs/learning.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.config import LearningConfig
from engine.registry import Lazy, Registry

if TYPE_CHECKING:
    from engine.config import RunConfig
    from engine.server.update import Update


class Schedule(Protocol):
    def factor(self, step: float) -> float:
        """The learning-rate multiplier for an update after ``step`` earlier ones (updates, or
        a worker's clocks when indexed by epoch)."""
        ...


class StalenessRule(Protocol):
    def factor(self, worker: int, staleness: int, update: Update) -> float:
        """The multiplier of a push applied on arrival, relative to the aggregator's scaling;
        ``update`` is the push as the aggregator scaled it (some rules look at its size)."""
        ...


@dataclass(frozen=True)
class RuleContext:
    """What a rule is built with: the settings, the workers, the aggregator's divisor and the
    shard's size (for rules that keep per-worker state on the shard)."""

    config: LearningConfig
    workers: int
    divisor: int
    size: int

    @property
    def relative(self) -> float:
        """λ relative to what the aggregator already applied (1/divisor of each push)."""
        rate = self.config.global_lr if self.config.global_lr is not None else 1 / self.workers
        return rate * self.divisor


def _has_step_every(run: RunConfig) -> None:
    if run.learning.step_every is None:
        raise ValueError("learning.schedule step needs learning.step_every (updates per decay)")


def _has_total(run: RunConfig) -> None:
    if run.learning.total is None:
        raise ValueError("learning.schedule cosine needs learning.total (updates to anneal "
                         "over)")


# (settings, steps per unit) -> schedule; a unit is one update, or one epoch of clocks
SCHEDULES: Registry[Callable[[LearningConfig, float], Schedule]] = Registry(
    "learning-rate schedule")
SCHEDULES.register("constant", Lazy("engine.server.learning:build_constant"),
                   "the same rate throughout")
SCHEDULES.register("step", Lazy("engine.server.learning:build_step"),
                   "times gamma every step_every updates (or epochs)",
                   requires=(_has_step_every,))
SCHEDULES.register("cosine", Lazy("engine.server.learning:build_cosine"),
                   "half a cosine from 1 to floor over total updates (or epochs)",
                   requires=(_has_total,))

STALENESS_RULES: Registry[Callable[[RuleContext], StalenessRule]] = Registry("staleness rule")
STALENESS_RULES.register("none", Lazy("engine.server.learning:build_no_rule"),
                         "every push at the aggregator's scale (push_scale)")
STALENESS_RULES.register("consgd", Lazy("engine.server.learning:build_consgd"),
                         "a constant global rate λ (global_lr, default 1/workers) times every push")
STALENESS_RULES.register("dynsgd", Lazy("engine.server.learning:build_dynsgd"),
                         "λ / (staleness + 1): a push τ updates stale counts 1/(τ+1)")
STALENESS_RULES.register("dynssgc", Lazy("engine.server.learning:build_dynssgc"),
                         "λ / (max staleness of the shard's recent pushes + 1)")
STALENESS_RULES.register(
    "adaptive", Lazy("engine.server.learning:build_adaptive"),
    "λ / sqrt(sum of the worker's squared push norms): less-pushed workers step further")
STALENESS_RULES.register(
    "split", Lazy("engine.server.learning:build_split"),
    "direction/distance splitting: the latest gradients' sum keeps its length")
