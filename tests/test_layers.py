"""The import-layer contract, read from the source (no imports run): which package may import
which, and nobody imports another module's private (underscore) names.

Data flows one way, CLI -> launcher -> role processes -> recorder -> SQLite -> dashboard/CLI, and
the layers below must not reach up: the wire format knows nothing of servers or workers, the
database layer nothing of the recorder, and the CLI and dashboard never import torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "psctl", "webui")

# (importer prefix, forbidden module prefix)
FORBIDDEN = [
    ("psctl", "torch"), ("webui", "torch"),
    ("engine.db", "engine.recorder"),
    ("engine.wire", "engine.server"), ("engine.wire", "engine.worker"),
    ("engine.wire", "engine.roles"), ("engine.wire", "engine.consistency"),
    ("engine.consistency", "engine.server"), ("engine.consistency", "engine.worker"),
    ("engine.consistency", "engine.roles"),
    ("engine.server", "engine.worker"), ("engine.server", "engine.roles"),
    ("engine.worker", "engine.server"), ("engine.worker", "engine.roles"),
    ("engine.transport", "engine.roles"), ("engine.transport", "engine.worker"),
    ("engine.transport", "engine.server"),
    ("engine.keys", "engine.wire"), ("engine.keys", "engine.server"),
    ("engine.errors", "engine."), ("engine.registry", "engine.keys"),
    ("engine", "psctl"), ("engine", "webui"),
    # the launcher backends start roles; they know nothing of what a role does, nor torch
    ("engine.hosts", "engine.roles"), ("engine.hosts", "torch"),
    ("engine.roles", "engine.hosts"),
]
# Ray is an optional extra: only the Ray backend's modules may import it (lazily).
RAY_MODULES = ("engine.hosts.ray_cluster", "engine.hosts.ray_host")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import statement, at any depth."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(prefix if prefix.endswith(".")
                                                        else prefix + ".")


@pytest.mark.parametrize(("importer", "forbidden"), FORBIDDEN)
def test_layer_does_not_import_upwards(importer: str, forbidden: str) -> None:
    offenders = [f"{name} imports {module}" for name, path in modules().items()
                 if under(name, importer) for module, _ in imports(path)
                 if under(module, forbidden)]
    assert offenders == []


def test_ray_is_imported_by_the_ray_backend_alone() -> None:
    offenders = [f"{name} imports {module}" for name, path in modules().items()
                 if name not in RAY_MODULES for module, _ in imports(path) if under(module, "ray")]
    assert offenders == []
    source = (REPO / "engine" / "hosts" / "ray_cluster.py").read_text()
    assert 'import_module("ray")' in source  # at run time only, behind a clear error


def test_no_module_imports_another_modules_private_names() -> None:
    ours = modules()
    offenders = [f"{name}: from {module} import {imported}"
                 for name, path in ours.items() for module, names in imports(path)
                 if module in ours and module != name
                 for imported in names
                 if imported.startswith("_") and not imported.startswith("__")]
    assert offenders == []


def test_the_checks_see_the_tree() -> None:
    # so that an empty walk cannot pass the tests above
    found = modules()
    assert {"engine.wire.protocol", "engine.server.shard", "psctl.cli", "webui.app"} <= set(found)
    assert any(m == "engine.errors" for m, _ in imports(found["engine.wire.protocol"]))
    assert under("engine.server.shard", "engine.server")
    assert not under("engine.serverx", "engine.server")


def test_the_dashboard_imports_no_command_module() -> None:
    """The dashboard and the CLI are two faces of what lies below them (engine.analysis, the
    database): the dashboard never reaches into a Typer command module for it."""
    found = modules()
    commands = {name for name, path in found.items() if under(name, "psctl")
                and any(under(module, "typer") for module, _ in imports(path))}
    offenders = [f"{name} imports {module}" for name, path in found.items()
                 if under(name, "webui") for module, _ in imports(path) if module in commands]
    assert commands and offenders == []
