"""docs/architecture.md's policy tables list exactly what the registries hold, in order."""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.backends import BACKENDS
from engine.consistency.registry import CONSISTENCY_MODELS
from engine.datasets.registry import DATASETS
from engine.models.kinds import MODELS
from engine.policies.aggregation import AGGREGATION_RULES
from engine.policies.learning import SCHEDULES, STALENESS_RULES
from engine.policies.loops import WORKER_LOOPS
from engine.policies.optimizers import SERVER_OPTIMIZERS
from engine.registry import Registry
from engine.server.pull_filter import PULL_FILTERS
from engine.transport.kinds import TRANSPORTS
from engine.wire.codecs import CODECS
from engine.worker.filters import PRUNE_RULES
from engine.worker.scheduled import REQUEST_SCHEDULES

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "architecture.md").read_text()


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
    ("### Models", MODELS),
    ("### Data sets", DATASETS),
    ("### Transports", TRANSPORTS),
])
def test_policy_table_matches_its_registry(heading: str, registry: Registry[Any]) -> None:
    assert table_after(heading) == list(registry.names())


EXAMPLE = DOC.split("## Worked example: add a consistency model", 1)[1].split("\n## ", 1)[0]


def _commands() -> list[str]:
    """The example's shell commands, continuation lines joined, comments dropped."""
    block = EXAMPLE.split("```console\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [line[2:].split("  #", 1)[0].strip() for line in block.splitlines()
            if line.startswith("$ ")]


def _run(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command)
    while "=" in words[0]:  # VAR=value psctl ...
        name, value = words.pop(0).split("=", 1)
        env = {**env, name: value}
    assert words[0] == "psctl", command
    return subprocess.run([sys.executable, "-m", "psctl", *words[1:]], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.integration
def test_a_new_consistency_model_is_one_module_and_one_registration(tmp_path: Path) -> None:
    """The worked example, as written: its module from the doc, no other file changed; its flag
    in the help, its table in config show, its rule refusing a run, a simulated run under it."""
    code = EXAMPLE.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "capped.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "COLUMNS": "200"}
    env.pop("PSCTL_PLUGINS", None)
    export, help_, show, refused, run = _commands()
    assert export == "export PSCTL_PLUGINS=capped"
    env["PSCTL_PLUGINS"] = "capped"

    listed = _run(help_, env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    text = " ".join(listed.stdout.split())
    assert "bounded-delay, dssp, elastic or capped [bsp]" in text
    assert "--cap <int> capped: clocks the fastest worker may lead the slowest [2]" in text

    shown = _run(show, env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"sync\.capped\.cap[\s│]+2[\s│]+default", shown.stdout), shown.stdout

    refusal = _run(refused, env, tmp_path)
    assert refusal.returncode == 2  # options the policy's rule refuses: a usage error
    said = EXAMPLE.split("exit code 2:\n", 1)[1].split("\n", 1)[0]
    assert said in " ".join(refusal.stderr.split())

    trained = _run(run, env, tmp_path)
    assert trained.returncode == 0, trained.stderr
    with sqlite3.connect(tmp_path / "experiments.db") as db:
        (stored,) = db.execute("SELECT config_json FROM runs").fetchone()
        staleness = db.execute("SELECT max(staleness) FROM iterations").fetchone()[0]
    sync = json.loads(stored)["sync"]
    assert sync["model"] == "capped" and sync["capped"] == {"cap": 1}
    assert 0 <= staleness <= 1  # the bound the run was given
