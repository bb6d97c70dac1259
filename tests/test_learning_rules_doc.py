"""docs/learning.md's table of the staleness rules against their sources: each row's settings,
run on a real shard (plain SGD, lr η), apply every push exactly as the source's formula says,
computed here from the pushes' staleness."""

from __future__ import annotations

import re
import shlex
from collections import deque
from typing import Any

import numpy as np
import pytest

from engine.config import RunConfig
from engine.keys import KeyLayout, KeyRange
from engine.plan import build_config
from engine.roles.copies import build_shard
from tests.conftest import REPO

WORKERS, ETA = 4, 0.5
KEYS = KeyRange(0, 3)
# (worker, the shard versions its gradient is stale by): fresh, then older and older pushes
PUSHES = [(0, 0), (1, 1), (2, 2), (3, 0), (0, 3), (1, 0), (2, 1), (3, 3), (0, 0), (1, 2)]


def table() -> dict[str, str]:
    """The rule -> where-they-coincide column of the doc's table."""
    doc = (REPO / "docs" / "learning.md").read_text()
    start = doc.index("| rule | the source's update |")
    rows = {}
    for line in doc[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[-1].split("`")[1]
    return rows


def setting_of(flag: str) -> str:
    """The config setting a psctl launch flag sets, from the schema itself."""
    for section, info in RunConfig.model_fields.items():
        fields = getattr(info.annotation, "model_fields", {})
        for name, field in fields.items():
            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get(
                    "flag") == flag:
                return f"{section}.{name}"
    raise AssertionError(f"no setting has the flag {flag}")


def config_of(flags: str) -> RunConfig:
    words = shlex.split(flags)
    values: dict[str, Any] = {setting_of(f): v for f, v in zip(words[::2], words[1::2],
                                                                strict=True)}
    return build_config({}, {"data.dataset": "digits", "cluster.workers": WORKERS,
                             "optimizer.lr": ETA, "optimizer.momentum": 0.0, **values})


def source_rates(rule: str, flags: str) -> list[float]:
    """The multiplier of η g for each push, as the source defines the rule."""
    given = re.search(r"--global-lr (\S+)", flags)
    lam = float(given.group(1)) if given else 1.0
    window: deque[int] = deque(maxlen=2 * WORKERS)
    rates = []
    for _, tau in PUSHES:
        window.append(tau)
        rates.append({"plain asynchronous SGD": 1.0, "consgd": lam, "dynsgd": 1 / (tau + 1),
                      "dynssgc": 1 / (max(window) + 1)}[rule])
    return rates


@pytest.mark.parametrize("rule", ["plain asynchronous SGD", "consgd", "dynsgd", "dynssgc"])
def test_each_rule_coincides_with_its_source_where_the_doc_says(rule: str) -> None:
    flags = table()[rule].removeprefix("psctl launch ")
    config = config_of(flags)
    shard = build_shard(config, KEYS, KeyLayout.single(len(KEYS)))
    shard.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    rng = np.random.default_rng(0)
    clocks = [0] * WORKERS
    for (worker, tau), rate in zip(PUSHES, source_rates(rule, flags), strict=True):
        grad = rng.normal(size=len(KEYS)).astype(np.float32)
        expected = shard.params - np.float32(ETA * rate) * grad
        shard.push(worker, clocks[worker], KEYS, grad, base_version=shard.version - tau)
        clocks[worker] += 1
        np.testing.assert_allclose(shard.params, expected, rtol=1e-5, atol=1e-7)


def test_the_table_names_every_rule_the_issue_asks_for() -> None:
    assert {"consgd", "dynsgd", "dynssgc", "plain asynchronous SGD"} <= set(table())
