"""Parsing of ``psctl launch --lr-schedule``: ``constant``, ``step:EVERY[:GAMMA]`` or
``cosine:TOTAL[:FLOOR]`` become the plain ``[learning]`` values the stored config keeps; and the
launch's warnings about settings measured to diverge or known to count a momentum twice."""

from __future__ import annotations

from typing import Any

from engine.config import RunConfig
from engine.errors import ConfigError
from engine.policies.optimizers import SERVER_MOMENTUM, SERVER_OPTIMIZERS

SCHEDULE_FORMS = "constant, step:EVERY[:GAMMA] or cosine:TOTAL[:FLOOR]"


def parse_schedule(text: str) -> dict[str, Any]:
    """``step:2000:0.5`` -> schedule step, step_every 2000, gamma 0.5 (EVERY and TOTAL count
    the shard's updates)."""
    name, *numbers = [part.strip() for part in text.strip().split(":")]
    fields = {"constant": (), "step": ("step_every", "gamma"), "cosine": ("total", "floor")}
    if name not in fields or len(numbers) > len(fields[name]) or (name != "constant"
                                                                    and not numbers):
        raise ConfigError(f"--lr-schedule {text!r}: expected {SCHEDULE_FORMS}, e.g. step:2000:0.5 "
                          "(halve the rate every 2000 updates of a shard) or cosine:20000")
    values: dict[str, Any] = {"learning.schedule": name}
    for key, number in zip(fields[name], numbers, strict=False):
        values[f"learning.{key}"] = _number(text, number, whole=key in ("step_every", "total"))
    return values


def _number(text: str, value: str, *, whole: bool) -> int | float:
    try:
        return int(value) if whole else float(value)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"--lr-schedule {text!r}: {value!r} is not {kind}") from None


def downpour_momentum_note(config: RunConfig) -> str | None:
    """A warning for Downpour's summed, stale pushes on servers with momentum: measured to
    diverge here (docs/learning.md), where Adagrad or plain SGD trained."""
    train, optimizer = config.train, config.optimizer
    batching = train.fetch_every > 1 or train.push_every > 1
    if not batching or not _server_momentum(config):
        return None
    return (f"server momentum {optimizer.momentum:g} with Downpour's summed, stale pushes "
            "diverged on MNIST and digits here (docs/learning.md); DistBelief ran Downpour with "
            "Adagrad: add --optimizer adagrad, or --momentum 0")


def momentum_twice_note(config: RunConfig) -> str | None:
    """A warning for Deep Gradient Compression's momentum correction on servers that apply a
    momentum too: Lin et al. keep the momentum on the workers alone."""
    correction = config.comm.momentum_correction
    if not correction or not _server_momentum(config):
        return None
    return (f"--momentum-correction {correction:g} keeps a momentum on the workers (Deep Gradient "
            f"Compression); server momentum {config.optimizer.momentum:g} applies one again to "
            "what they push: add --momentum 0")


def _server_momentum(config: RunConfig) -> bool:
    optimizer = config.optimizer
    return optimizer.momentum > 0 and SERVER_OPTIMIZERS.can(optimizer.name, SERVER_MOMENTUM)
