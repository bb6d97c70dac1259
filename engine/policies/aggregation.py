"""The aggregation rules (``--aggregation``, config ``sync.push_scale``): what a round's sum, or a
push applied on arrival, is divided by. Implementation: ``engine.server.aggregation``."""

from __future__ import annotations

from collections.abc import Callable

from engine.registry import Registry

# workers -> what a round's sum (or one push) is divided by
AGGREGATION_RULES: Registry[Callable[[int], int]] = Registry("aggregation rule")
AGGREGATION_RULES.register("mean", lambda workers: workers,
                           "the mean over workers: a push applied on arrival counts 1/workers")
AGGREGATION_RULES.register("sum", lambda workers: 1,
                           "the sum over workers: a push applied on arrival counts whole")
