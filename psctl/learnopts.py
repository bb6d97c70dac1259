"""Parsing of ``psctl launch --lr-schedule``: ``constant``, ``step:EVERY[:GAMMA]`` or
``cosine:TOTAL[:FLOOR]`` become the plain ``[learning]`` values the stored config keeps; and the
launch's warning about settings measured to diverge."""

from __future__ import annotations

from typing import Any

from engine.config import RunConfig
from engine.errors import ConfigError

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
    if not batching or optimizer.name != "sgd" or optimizer.momentum == 0:
        return None
    return (f"server momentum {optimizer.momentum:g} with Downpour's summed, stale pushes "
            "diverged on MNIST and digits here (docs/learning.md); DistBelief ran Downpour with "
            "Adagrad: add --optimizer adagrad, or --momentum 0")
