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

from tests.tooling import import_cycles

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "psctl", "webui")

# The layers, top to bottom: a module may import its own layer and those below, never one
# above (imports inside functions and under TYPE_CHECKING count). A module belongs to the
# layer of its longest matching prefix. docs/architecture.md draws the same list.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("psctl",),                       # the command line
    ("webui",),                       # the dashboard, which psctl ui starts
    ("psctl.settings",),              # where the database is, exit codes: both faces read it
    ("engine.plan",),                 # composes a run from flags, files and the policies
    ("engine.catalog",),              # which setting names which kind of policy
    ("engine.backends",),             # local, ray, sim
    ("engine.sim",),                  # the simulated cluster (a backend)
    ("engine.launcher", "engine.hosts"),
    ("engine.roles",),                # coordinator, server, worker, evaluator processes
    ("engine.worker", "engine.server"),
    ("engine.sandblaster", "engine.replication", "engine.consistency", "engine.models",
     "engine.datasets", "engine.faults", "engine.analysis", "engine.stopping",
     "engine.recorder", "engine.policies"),
    ("engine.db", "engine.transport"),
    ("engine.wire",),
    ("engine.aio", "engine.keys", "engine.keyrows", "engine.registry", "engine.userfiles",
     "engine.plugins", "engine.server.update"),  # update: a value type a policy takes
    ("engine.config",),               # the schema: pydantic and engine.errors only
    ("engine.errors", "engine.usermetrics", "engine"),  # psctl.log's checks: errors only
)

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


def layer_of(module: str) -> int | None:
    """The index in LAYERS (0 at the top) of the layer ``module`` belongs to."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if under(module, prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward_imports(edges: import_cycles.Graph) -> list[str]:
    """Every import of a module in a layer above the importer's. A package whose __init__
    imports only modules of the importer's layer or below (none, or ``psctl``'s
    ``engine.usermetrics`` for ``psctl.log``) is passed through, not used: ``from psctl import
    settings``; what its __init__ runs is checked as its own imports."""
    found = []
    for importer, targets in sorted(edges.items()):
        low = layer_of(importer)
        for target in sorted(targets):
            below = all(low is not None and (layer_of(t) or 0) >= low
                        for t in edges.get(target, ()))
            if below and any(m.startswith(target + ".") for m in edges):
                continue
            high = layer_of(target)
            if low is not None and high is not None and high < low:
                found.append(f"{importer} (layer {low}) imports {target} (layer {high})")
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(import_cycles.graph()) == []


def test_every_module_has_a_layer() -> None:
    assert [name for name in import_cycles.graph() if layer_of(name) is None] == []


def test_no_import_cycle() -> None:
    edges = import_cycles.graph()
    assert [import_cycles.a_cycle(edges, c) for c in import_cycles.components(edges)] == []


def test_a_new_upward_import_is_caught(tmp_path: Path) -> None:
    # engine.config is the schema: it may not ask a policy, even from inside a function
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").touch()
    (tmp_path / "engine" / "worker").mkdir()
    (tmp_path / "engine" / "worker" / "__init__.py").touch()
    (tmp_path / "engine" / "worker" / "registry.py").write_text("LOOPS = {}\n")
    (tmp_path / "engine" / "config.py").write_text(
        "def known(name):\n    from engine.worker.registry import LOOPS\n"
        "    return name in LOOPS\n")
    (tmp_path / "psctl" / "cli.py").write_text("from psctl import settings\n")
    (tmp_path / "psctl" / "settings.py").write_text("import engine.config\n")
    edges = import_cycles.graph(tmp_path)
    assert upward_imports(edges) == [
        f"engine.config (layer {layer_of('engine.config')}) imports engine.worker.registry "
        f"(layer {layer_of('engine.worker')})"]
    (tmp_path / "engine" / "config.py").write_text("KNOWN = ()\n")
    assert upward_imports(import_cycles.graph(tmp_path)) == []


def test_the_schema_asks_no_policy() -> None:
    """engine.config is a leaf: which names and combinations a run may take are the policies'
    rules, asked by engine.plan."""
    assert import_cycles.graph()["engine.config"] == {"engine.errors"}
    outside = {module.split(".")[0] for module, _ in imports(REPO / "engine" / "config.py")}
    assert outside <= {"__future__", "re", "tomllib", "pathlib", "typing", "pydantic", "engine"}
