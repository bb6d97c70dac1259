"""One loop, two clocks: the simulator has no worker loop of its own. It runs the loops of
engine/worker/ (registered in engine.policies.loops), the real ShardServer, ParameterClient and
evaluator; read from the source, so a copy added later fails here."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[3] / "engine" / "sim"
# What a copy of a role's logic would define: a loop's steps, a server's handling of frames.
ROLE_METHODS = {"step", "begin", "end", "_iteration", "_handle", "_dispatch", "_answer_pull",
                "measure"}


def test_no_loop_class_nor_a_registry_of_loops_under_engine_sim() -> None:
    for path in sorted(SIM.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert "SIM_LOOPS" not in names, path
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                assert not methods & ROLE_METHODS, (path.name, node.name, methods & ROLE_METHODS)


def test_the_simulator_builds_the_registered_loop_and_the_real_roles() -> None:
    source = (SIM / "cluster.py").read_text()
    for used in ("WORKER_LOOPS.get(loop_name(", "ShardServer(", "ParameterClient(",
                 "from engine.roles.evaluator import"):
        assert used in source
