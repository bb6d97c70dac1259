"""docs/architecture.md's policy tables list exactly what the registries hold, in order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from engine.backends import BACKENDS
from engine.consistency.registry import CONSISTENCY_MODELS
from engine.policies.aggregation import AGGREGATION_RULES
from engine.policies.learning import SCHEDULES, STALENESS_RULES
from engine.policies.loops import WORKER_LOOPS
from engine.policies.optimizers import SERVER_OPTIMIZERS
from engine.registry import Registry
from engine.server.pull_filter import PULL_FILTERS
from engine.sim.worker import SIM_LOOPS
from engine.wire.codecs import CODECS
from engine.worker.filters import PRUNE_RULES
from engine.worker.scheduled import REQUEST_SCHEDULES

DOC = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()


def table_after(heading: str) -> list[str]:
    section = DOC.split(heading, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


@pytest.mark.parametrize(("heading", "registry"), [
    ("### Consistency models", CONSISTENCY_MODELS),
    ("### Server optimizers", SERVER_OPTIMIZERS),
    ("### Aggregation rules", AGGREGATION_RULES),
    ("### Learning-rate schedules", SCHEDULES),
    ("### Staleness rules", STALENESS_RULES),
    ("### Worker loops", WORKER_LOOPS),
    ("### Push filters", PRUNE_RULES),
    ("### Pull filters", PULL_FILTERS),
    ("### Wire codecs", CODECS),
    ("### Request schedules", REQUEST_SCHEDULES),
    ("### Backends", BACKENDS),
    ("### Simulated worker loops", SIM_LOOPS),
])
def test_policy_table_matches_its_registry(heading: str, registry: Registry[Any]) -> None:
    assert table_after(heading) == list(registry.names())
