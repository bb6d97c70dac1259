"""docs/cluster.md's bash blocks run as written, in one bash session in an empty folder: a Ray
cluster of three loopback nodes started in the background, a run launched on it and shown, then
a run whose every role is started by hand on its own address. Between the blocks the test adds
only what the document asks of the reader: wait for the cluster to say where its head is; at the
end it stops the background processes the blocks started, by their pids."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DOC = (REPO / "docs" / "cluster.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)
if os.environ.get("CI") != "true":  # CI installs Ray and must run this; elsewhere, skip
    pytest.importorskip("ray")

# Waits until the cluster started in the background printed where its head is (the reader
# watches for that line), and records the background pids of each block to stop at the end.
_AWAIT_HEAD = """
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null; wait $cluster' EXIT
for _ in $(seq 300); do grep -q "head at" cluster.out && break; sleep 0.5; done
grep "head at" cluster.out
"""
_STOP = """
for job in $(jobs -p); do [ "$job" = "$cluster" ] || wait "$job"; done
"""


def _query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def test_the_documented_commands_run_on_a_loopback_cluster_and_by_hand(tmp_path: Path) -> None:
    assert len(BLOCKS) == 3, "the test knows three bash blocks: cluster, launch, join contract"
    cluster, launch, join = BLOCKS
    assert cluster.rstrip().endswith("&")
    start = cluster.rstrip().removesuffix("&")
    script = "set -e\n" + start + "> cluster.out 2>&1 &\n" + _AWAIT_HEAD + launch + join + _STOP
    env = {**os.environ, "PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1",
           "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("PSCTL_TOKEN", None)
    output = tmp_path / "output.txt"
    # Output to a file, not a pipe (Ray's daemons must not hold the test's pipe open), and in a
    # session of its own, so that a timeout stops all of it (the cluster stops its nodes).
    with output.open("wb") as sink:
        shell = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = shell.wait(timeout=480)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGTERM)
            shell.wait(60)
            raise
        finally:
            text = output.read_text(errors="replace")
    assert code == 0, text[-6000:]
    assert "head at 127.0.0.4:6390" in text
    db = tmp_path / "experiments.db"
    runs = _query(db, "SELECT id, status, config_json FROM runs ORDER BY started_at")
    assert [status for _, status, _ in runs] == ["finished", "finished"]
    on_ray, by_hand = runs
    assert json.loads(on_ray[2])["cluster"]["backend"] == "ray"
    # the launch's roles spread over the loopback nodes, and runs show says where
    nodes = {json.loads(d)["node"] for (d,) in _query(
        db, "SELECT detail FROM events WHERE run_id = ? AND kind = 'process_joined'", on_ray[0])}
    assert len(nodes) >= 2 and nodes <= {"127.0.0.2", "127.0.0.3", "127.0.0.4"}, nodes
    assert "nodes: 127.0.0." in text
    # by hand: each role on the address its line gave it
    placed = {(d["role"], d["rank"]): d["node"] for d in (json.loads(d) for (d,) in _query(
        db, "SELECT detail FROM events WHERE run_id = ? AND kind = 'process_joined'",
        by_hand[0]))}
    assert placed == {("server", 0): "127.0.0.11", ("server", 1): "127.0.0.12",
                      ("worker", 0): "127.0.0.13", ("worker", 1): "127.0.0.14",
                      ("evaluator", 0): "127.0.0.15"}
    # each server listened on its own address, where the workers reached it, and they learned
    listening = [json.loads(d)["address"] for (d,) in _query(
        db, "SELECT detail FROM events WHERE run_id = ? AND kind = 'server_listening'",
        by_hand[0])]
    assert sorted(a.rsplit(":", 1)[0] for a in listening) == ["tcp://127.0.0.11",
                                                              "tcp://127.0.0.12"]
    for run_id, _, _ in runs:
        accuracy = _query(db, "SELECT accuracy FROM evaluations WHERE run_id = ? ORDER BY at "
                              "DESC LIMIT 1", run_id)[0][0]
        # how well and how fast each backend learns is bench/cluster.py's
        assert 0 <= accuracy <= 1, (run_id, accuracy)
    # nothing the blocks started outlives them
    # (its own: another test's Ray cluster may run beside it, on a port of its own)
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert not [line for line in processes if "ray start" in line and "6390" in line]
