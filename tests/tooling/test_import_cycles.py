"""The cycle finder on small made-up packages: what it must find and what it must not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tooling import import_cycles


def _tree(root: Path, files: dict[str, str]) -> Path:
    for package in import_cycles.PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_an_import_inside_a_function_closes_a_cycle(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "engine/config.py": "def check():\n    from engine.policies import sgd\n",
        "engine/policies/__init__.py": "",
        "engine/policies/sgd.py": "from engine.config import check\n",
        "psctl/cli.py": "import engine.config\n",
    })
    edges = import_cycles.graph(root)
    found = import_cycles.components(edges)
    assert found == [["engine.config", "engine.policies.sgd"]]  # the empty package is no link
    assert import_cycles.a_cycle(edges, found[0]) == [
        "engine.config", "engine.policies.sgd", "engine.config"]


def test_relative_imports_and_from_package_import_module_are_followed(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "engine/db/__init__.py": "from . import queries\n",
        "engine/db/queries.py": "from .faults import x\n",
        "engine/db/faults.py": "from engine.db.queries import y\n",
    })
    assert import_cycles.components(import_cycles.graph(root)) == [
        ["engine.db.faults", "engine.db.queries"]]


@pytest.mark.parametrize("text", [
    "from engine.db.queries import y\n",  # the package holding the importer is running already
    "import json\nimport engine.wire\n",  # outside modules and a module with no way back
])
def test_no_cycle_where_there_is_none(tmp_path: Path, text: str) -> None:
    root = _tree(tmp_path, {
        "engine/db/__init__.py": "from engine.db import queries\n",
        "engine/db/queries.py": "",
        "engine/db/faults.py": text,
        "engine/wire.py": "",
    })
    assert import_cycles.components(import_cycles.graph(root)) == []


def test_the_command_says_each_cycle_and_fails_while_there_is_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, {"psctl/cli.py": "import psctl.role\n",
                            "psctl/role.py": "def f():\n    from psctl import cli\n"})
    assert import_cycles.main([], root) == 1
    assert capsys.readouterr().out.splitlines() == [
        "2 modules in a cycle, e.g. psctl.cli -> psctl.role -> psctl.cli",
        "1 cycles (2 modules) among 5 modules"]
    assert import_cycles.main(["--json"], root) == 1
    assert json.loads(capsys.readouterr().out)[0]["modules"] == ["psctl.cli", "psctl.role"]
    (root / "psctl" / "role.py").write_text("")
    assert import_cycles.main([], root) == 0
