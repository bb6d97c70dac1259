"""Every setting that names a policy, with the registry that knows the names: what engine.plan
checks a run against and what ``psctl launch --help`` lists; and the models, which own settings
and imply others as policies do. Reading it imports no implementation: the registries hold
theirs ``Lazy``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine import plugins
from engine.backends import BACKENDS
from engine.consistency.registry import CONSISTENCY_MODELS
from engine.models.kinds import MODELS
from engine.policies.aggregation import AGGREGATION_RULES
from engine.policies.learning import SCHEDULES, STALENESS_RULES
from engine.policies.loops import WORKER_LOOPS
from engine.policies.optimizers import SERVER_OPTIMIZERS
from engine.registry import Registry
from engine.transport.kinds import TRANSPORTS

if TYPE_CHECKING:
    from pydantic import BaseModel

# The setting (dotted) -> the registry of the policies it names, in the config's order.
NAMED: dict[str, Registry[Any]] = {
    "cluster.backend": BACKENDS, "sync.model": CONSISTENCY_MODELS,
    "sync.push_scale": AGGREGATION_RULES, "optimizer.name": SERVER_OPTIMIZERS,
    "learning.schedule": SCHEDULES, "learning.rule": STALENESS_RULES,
    "train.loop": WORKER_LOOPS, "cluster.transport": TRANSPORTS}
# Policies from outside psctl register themselves now, before anything lists or checks one.
plugins.load()
# Names a setting takes that are no policy: ``train.loop auto`` picks the loop the run needs.
EXTRA_NAMES: dict[str, tuple[str, ...]] = {"train.loop": ("auto",)}
# Every setting that names something registered with settings of its own and settings it
# implies: the policies, and the model, which is not checked against its registry (a user's
# file is a model too). In the order engine.plan asks what each implies: the model first, so
# that the optimizer it implies implies its own learning rate in turn.
OWNERS: dict[str, Registry[Any]] = {"model.name": MODELS, **NAMED}


def names(setting: str) -> tuple[str, ...]:
    """Every value ``setting`` (one of NAMED) may take, in the order --help lists them."""
    return EXTRA_NAMES.get(setting, ()) + NAMED[setting].names()


def implied(setting: str) -> list[tuple[str, object]]:
    """(policy or model, value) for every one that implies a value of ``setting``: the
    optimizers' learning rates, for ``optimizer.lr``."""
    return [(entry.name, entry.implies[setting]) for registry in OWNERS.values()
            for entry in registry if setting in entry.implies]


def own_settings() -> list[tuple[str, str, type[BaseModel]]]:
    """(section, policy or model, its settings model) for every one with settings of its own:
    they live in the table ``[section.name]``."""
    return [(dotted.split(".")[0], entry.name, entry.settings)
            for dotted, registry in OWNERS.items() for entry in registry
            if entry.settings is not None]
