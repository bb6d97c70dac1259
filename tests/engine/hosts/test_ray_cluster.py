"""The Ray backend's checks before any cluster is involved: Ray missing, no cluster where the
address says, and the settings it takes."""

from __future__ import annotations

import importlib
import socket
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

from engine.errors import ConfigError, LaunchError
from engine.hosts import ray_cluster
from engine.plan import build_config


def test_without_ray_the_backend_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_ray(name: str, package: str | None = None) -> ModuleType:
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_ray)
    with pytest.raises(LaunchError, match=r"pip install 'psctl\[ray\]'"):
        ray_cluster.import_ray()


def test_auto_takes_ray_address_then_the_note_ray_start_leaves(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ray_cluster.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.4:6390")
    assert ray_cluster._auto_address() == "127.0.0.4:6390"
    monkeypatch.setenv("RAY_ADDRESS", "ray://127.0.0.4:10001")
    with pytest.raises(LaunchError, match="client address"):
        ray_cluster._auto_address()
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(LaunchError, match="python -m engine.hosts.ray_local"):
        ray_cluster._auto_address()
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.4:41234\n")
    assert ray_cluster._auto_address() == "127.0.0.4:41234"


def test_a_head_that_does_not_answer_fails_at_once() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago, now closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(LaunchError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        ray_cluster._probe(f"127.0.0.1:{port}")
    assert time.monotonic() - started < ray_cluster.PROBE_TIMEOUT_S + 1


@pytest.mark.parametrize(("key", "value", "message"), [
    ("ray.address", "ray://head:10001", "client address"),
    ("ray.address", "head", "not auto or HOST:PORT"),
    ("ray.placement", "everywhere", "placement"),
    ("ray.worker_cpus", 0, "worker_cpus"),
    ("ray.worker_gpus", -1, "worker_gpus"),
])
def test_ray_settings_are_checked(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({}, {"cluster.backend": "ray", key: value})


def test_the_defaults_spread_one_cpu_per_role() -> None:
    config = build_config({}, {"cluster.backend": "ray"})
    assert (config.ray.address, config.ray.placement) == ("auto", "spread")
    assert (config.ray.worker_cpus, config.ray.server_cpus, config.ray.worker_gpus) == (1, 1, 0)


class _RayError(Exception):
    pass


class _Ref:
    def __init__(self, value: object = None, *, ready: bool = True) -> None:
        self.value, self.ready = value, ready


class _FakeRay:
    """What RayRole uses of Ray: wait, get and RayError, over refs a test resolves by hand."""

    class exceptions:  # Ray spells it so
        RayError = _RayError

    def wait(self, refs: list[_Ref], timeout: float = 0) -> tuple[list[_Ref], list[_Ref]]:
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    def get(self, ref: _Ref, timeout: float | None = None) -> object:
        if isinstance(ref.value, Exception):
            raise ref.value
        return ref.value


class _Method:
    def __init__(self, answers: list[_Ref]) -> None:
        self.answers, self.calls = answers, []

    def remote(self, *args: object) -> _Ref:
        self.calls.append(args)
        return self.answers.pop(0) if self.answers else _Ref(None)


class _Actor:
    def __init__(self, exits: list[_Ref]) -> None:
        self.wait_exit, self.signal = _Method(exits), _Method([])


def test_a_role_is_running_until_its_exit_comes_back_and_the_wait_is_asked_again() -> None:
    started = _Ref(None, ready=False)
    actor = _Actor([_Ref(None), _Ref(0, ready=False)])
    role = ray_cluster.RayRole(_FakeRay(), actor, started, Path("worker-0.log"))
    assert role.poll() is None  # not started yet
    role.send_signal(15)  # kept for when it has a pid
    started.value, started.ready = (4242, "127.0.0.3", "vm"), True
    assert role.poll() is None  # started; its first wait slice ended with the role running
    assert (role.pid, role.node) == (4242, "127.0.0.3")
    assert actor.signal.calls == [(4242, 15)]
    assert len(actor.wait_exit.calls) == 2  # asked again
    actor.wait_exit.answers = []
    last = role._exit
    assert isinstance(last, _Ref)
    last.ready = True
    assert role.poll() == 0 and role.wait(1) == 0


def test_an_actor_that_died_reads_as_its_role_killed() -> None:
    role = ray_cluster.RayRole(_FakeRay(), _Actor([_Ref(_RayError("actor died"))]),
                               _Ref((7, "127.0.0.2", "vm")), Path("worker-1.log"))
    assert role.poll() == -9
    never = ray_cluster.RayRole(_FakeRay(), _Actor([]), _Ref(_RayError("no room")),
                                Path("worker-2.log"))
    assert never.poll() == -9
    with pytest.raises(subprocess.TimeoutExpired):
        ray_cluster.RayRole(_FakeRay(), _Actor([]), _Ref(None, ready=False),
                            Path("w.log")).wait(0.2)
