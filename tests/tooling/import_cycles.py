"""Import cycles among psctl's own modules, read from the source (nothing is imported).

Every ``import`` counts, those inside functions too: an import moved into a function hides a
cycle at start-up but not from the design. ``import a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``;
``from a.b import c`` runs ``a.b.c`` too when ``c`` is a module (a package that holds the
importer is not counted for the modules it only passes through: it is running already). Cycles
are the strongly
connected components of that graph with more than one module (Tarjan's algorithm).

Run: ``python tests/tooling/import_cycles.py`` (``--json`` for the components and one cycle
through each, as a chain of imports). Exit code 1 when there is a cycle.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "psctl", "webui")

Graph = dict[str, set[str]]


def modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted name -> file, for every module of the packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _chain(name: str, importer: str) -> list[str]:
    """``name`` and the packages above it, less those that hold ``importer``."""
    parts = name.split(".")
    above = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [p for p in above if not importer.startswith(p + ".")] + [name]


def _targets(node: ast.AST, importer: str, is_package: bool) -> Iterable[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield from _chain(alias.name, importer)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the importer's package up
            package = importer.split(".")
            package = package if is_package else package[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        yield from _chain(base, importer)
        for alias in node.names:
            yield f"{base}.{alias.name}"


def graph(root: Path = REPO) -> Graph:
    """Module -> the own modules its imports run (itself excluded)."""
    known = modules(root)
    edges: Graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        edges[name] = {target for node in ast.walk(tree)
                       for target in _targets(node, name, is_package)
                       if target in known and target != name}
    return edges


def components(edges: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative Tarjan: deep chains must not hit the recursion limit
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return sorted(found, key=lambda c: (-len(c), c))


def a_cycle(edges: Graph, component: list[str]) -> list[str]:
    """One cycle through the component's first module, shortest by breadth-first search."""
    inside = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & inside):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is on no cycle of {component}")


def main(argv: list[str] | None = None, root: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the cycles as JSON")
    args = parser.parse_args(argv)
    edges = graph(root)
    found = components(edges)
    cycles = [a_cycle(edges, c) for c in found]
    if args.json:
        print(json.dumps([{"modules": c, "size": len(c), "cycle": cycle}
                          for c, cycle in zip(found, cycles, strict=True)], indent=2))
    else:
        for c, cycle in zip(found, cycles, strict=True):
            print(f"{len(c)} modules in a cycle, e.g. {' -> '.join(cycle)}")
        print(f"{len(found)} cycles ({sum(len(c) for c in found)} modules) among "
              f"{len(edges)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
