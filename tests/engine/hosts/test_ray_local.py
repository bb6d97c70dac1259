"""engine/hosts/ray_local.py: a head whose free port was taken before Ray bound it (Ray's GCS
listens on every interface; the probe asks one address) is started again on another free port,
a bounded number of times; any other failure, or a port the caller chose, fails at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import LaunchError
from engine.hosts import ray_local
from engine.hosts.ray_local import HEAD_TRIES, LocalRayCluster

TAKEN = "RuntimeError: Failed to start GCS. ... The specified port is 38061."


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[str],
             port: int = 0) -> tuple[LocalRayCluster, list[list[str]]]:
    cluster = LocalRayCluster(nodes=1, logs=tmp_path, port=port)
    started: list[list[str]] = []

    def launch(ray: str, name: str, command: list[str]) -> None:
        started.append(command)
        if failures:
            raise LaunchError(f"Ray node {name} did not start; its log:\n{failures.pop(0)}")

    monkeypatch.setattr(cluster, "_launch", launch)
    ports = iter(range(40000, 40010))
    monkeypatch.setattr(ray_local, "_free_port", lambda host: next(ports))
    return cluster, started


def test_a_taken_port_is_tried_again_on_another(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, started = _cluster(tmp_path, monkeypatch, [TAKEN])
    cluster._start_head("ray", [])
    assert [c[c.index("--port") + 1] for c in started] == ["40000", "40001"]
    assert cluster.address == "127.0.0.4:40001"


def test_it_gives_up_after_its_tries_and_on_any_other_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, started = _cluster(tmp_path, monkeypatch, [TAKEN] * HEAD_TRIES)
    with pytest.raises(LaunchError, match="Failed to start GCS"):
        cluster._start_head("ray", [])
    assert len(started) == HEAD_TRIES
    cluster, started = _cluster(tmp_path, monkeypatch, ["out of memory"])
    with pytest.raises(LaunchError, match="out of memory"):
        cluster._start_head("ray", [])
    assert len(started) == 1
    cluster, started = _cluster(tmp_path, monkeypatch, [TAKEN], port=6390)  # the caller's
    with pytest.raises(LaunchError):
        cluster._start_head("ray", [])
    assert len(started) == 1
