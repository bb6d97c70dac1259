"""``psctl launch --backend ray`` on a real Ray cluster of three nodes on loopback addresses
(a head on 127.0.0.4, nodes on 127.0.0.2 and 127.0.0.3): roles spread over the nodes, a worker
actor killed with -9 restarted by Ray and rejoining, and launch mistakes that fail fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.integration.support import processes_with, query, wait_for, wait_until_training

ray_local = pytest.importorskip("engine.hosts.ray_local")
if os.environ.get("CI") != "true":  # CI installs Ray and must run these; elsewhere, skip
    pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ray_local.LocalRayCluster]:
    with ray_local.local_cluster(nodes=3, cpus=2,
                                 logs=tmp_path_factory.mktemp("ray")) as running:
        yield running


def _launch(db: Path, cluster: ray_local.LocalRayCluster, *extra: str,
            env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "psctl", "launch", "--backend", "ray", "--ray-address",
         cluster.address, "--dataset", "digits", "--no-live", *extra],
        env=os.environ | cluster.env | {"PSCTL_DB": str(db), "NO_COLOR": "1"} | (env or {}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _joined(db: Path) -> list[dict[str, object]]:
    return [json.loads(detail) for (detail,) in query(
        db, "SELECT detail FROM events WHERE kind = 'process_joined'")]


def test_roles_spread_over_the_nodes_and_a_killed_worker_actor_is_restarted(
        cluster: ray_local.LocalRayCluster, tmp_path: Path) -> None:
    db = tmp_path / "ray.db"
    run = _launch(db, cluster, "--workers", "4", "--servers", "2", "--epochs", "12")
    try:
        wait_until_training(db, timeout=150)
        worker = next(j for j in _joined(db) if j["role"] == "worker" and j["rank"] == 1)
        role = psutil.Process(int(str(worker["pid"])))
        actor = role.parent()
        assert actor is not None and "RoleHost" in " ".join(actor.cmdline()), actor
        os.kill(actor.pid, signal.SIGKILL)  # the actor's process: its role dies with it
        out, err = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, out + err
    [(run_id, status)] = query(db, "SELECT id, status FROM runs")
    accuracy = query(db, "SELECT accuracy FROM evaluations ORDER BY at DESC LIMIT 1")[0][0]
    # Accuracy and time on Ray beside the local launch are bench/cluster.py's.
    assert status == "finished" and 0 <= accuracy <= 1
    joined = _joined(db)
    nodes = {str(j["node"]) for j in joined if j["role"] in ("server", "worker")}
    assert len(nodes) >= 2 and nodes <= set(cluster.node_addresses), nodes
    servers = {str(j["node"]) for j in joined if j["role"] == "server"}
    assert len(servers) == 2, "the two servers spread over two nodes"
    kinds = [kind for (kind,) in query(db, "SELECT kind FROM events ORDER BY id")]
    assert "worker_lost" in kinds and "worker_rejoined" in kinds
    rejoined = json.loads(query(
        db, "SELECT detail FROM events WHERE kind = 'worker_rejoined'")[0][0])
    assert rejoined["rank"] == 1 and rejoined["pid"] != worker["pid"]
    wait_for(lambda: not processes_with(run_id), 20, "the run's processes to end")


def test_a_cluster_without_room_fails_the_launch_naming_what_is_missing(
        cluster: ray_local.LocalRayCluster, tmp_path: Path) -> None:
    run = _launch(tmp_path / "full.db", cluster, "--workers", "4", "--servers", "2",
                  "--worker-cpus", "3", env={"PSCTL_RAY__START_TIMEOUT_S": "5"})
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, out + err
    assert "found no room for 2 servers" in err and "4 workers (3 CPU each" in err, err
    assert "6 CPU in 3 nodes" in err, err


def test_no_cluster_at_the_address_fails_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "psctl", "launch", "--backend", "ray", "--ray-address",
         "127.0.0.9:1", "--dataset", "digits", "--no-live", "--db", str(tmp_path / "x.db")],
        capture_output=True, text=True, timeout=60, check=False,
        env=os.environ | {"NO_COLOR": "1", "COLUMNS": "200"})
    assert done.returncode == 1
    assert "no Ray cluster answers at 127.0.0.9:1" in done.stderr, done.stderr
