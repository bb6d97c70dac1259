"""``psctl launch --help`` lists the policies from their registries, so a new consistency model,
optimizer, aggregation rule or worker loop shows up there without touching the CLI."""

from __future__ import annotations

from typing import Any

from engine.backends import BACKENDS
from engine.consistency.registry import CHANGING_WORKERS, CONSISTENCY_MODELS
from engine.policies.aggregation import AGGREGATION_RULES
from engine.policies.learning import STALENESS_RULES
from engine.policies.loops import WORKER_LOOPS
from engine.policies.optimizers import SERVER_OPTIMIZERS, default_lr
from engine.registry import Registry


def choices(registry: Registry[Any], default: str, *, extra: tuple[str, ...] = ()) -> str:
    """``a, b or c [default]``."""
    names = (*extra, *registry.names())
    listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    return f"{listed} [{default}]"


SYNC_HELP = "consistency model: " + choices(CONSISTENCY_MODELS, "bsp")
SCALE_WORKERS_HELP = ("the number of workers the job should have ("
                      + ", ".join(CONSISTENCY_MODELS.able(CHANGING_WORKERS)) + ")")
OPTIMIZER_HELP = "server optimizer: " + choices(SERVER_OPTIMIZERS, "sgd")
LR_HELP = ("server learning rate [the optimizer's own: " + ", ".join(
    f"{name} {default_lr(name):g}" for name in SERVER_OPTIMIZERS.names()) + "]")
RULE_HELP = ("staleness-aware rule for pushes applied on arrival: "
             + choices(STALENESS_RULES, "none"))
AGGREGATION_HELP = ("how pushes combine, per key: " + choices(AGGREGATION_RULES, "mean"))
LOOP_HELP = ("worker loop: " + choices(WORKER_LOOPS, "auto", extra=("auto",))
             + "; auto picks overlapped, downpour, delayed or plain as the other options need")
BACKEND_HELP = "where the roles run: " + choices(BACKENDS, "local")
