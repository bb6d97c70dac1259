"""Every role in a Ray actor, placed by Ray across a cluster (``cluster.backend = "ray"``).

The driver (``psctl launch``) connects to the cluster, reserves room for the servers (spread
over the nodes) and the workers (``ray.placement``) in two placement groups, and starts each
role in a ``RoleHost`` actor with its declared resources. The coordinator's actor is pinned to
the driver's node: it owns the recorder, so the run is still written to the local database
from one place. Each role binds its node's address (what Ray calls the node's IP) and tells the
coordinator where it runs; tensors travel over psctl's websockets, never through Ray.

Ray is imported here alone, and only when a run asks for it (``pip install 'psctl[ray]'``).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import RunConfig
from engine.errors import LaunchError
from engine.hosts import RoleEnv, RoleProcess, fresh_wave
from engine.hosts.ray_host import RoleHost

INSTALL_HINT = "pip install 'psctl[ray]'"
# A call to a role's actor that should answer at once (its log, a signal) waits this long.
CALL_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 5.0
_POLL_S = 0.1
_STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict-pack": "STRICT_PACK",
               "strict-spread": "STRICT_SPREAD"}


def import_ray() -> Any:
    """The ``ray`` module, or a LaunchError that says how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise LaunchError(f"--backend ray needs Ray, which is not installed here: "
                          f"{INSTALL_HINT} (on every node of the cluster too)") from None


@dataclass
class RayRole:
    """A role in its actor, as the launcher watches it (``RoleProcess``)."""

    ray: Any
    actor: Any
    started: Any  # the ObjectRef of RoleHost.start: (pid, node, machine)
    log: Path
    _pid: int = 0
    _node: str = ""
    _exit: Any = None
    _code: int | None = None
    _pending: list[int] = field(default_factory=list)  # signals sent before it started

    @property
    def pid(self) -> int:
        self._await_start(CALL_TIMEOUT_S)
        return self._pid

    @property
    def node(self) -> str:
        self._await_start(CALL_TIMEOUT_S)
        return self._node

    @property
    def returncode(self) -> int | None:
        return self._code

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        if self._exit is None:
            self._await_start(0)
            if self._exit is None:
                return self._code
        ready, _ = self.ray.wait([self._exit], timeout=0)
        if ready:
            self._take(self._exit)
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"ray actor {self.log.stem}", timeout or 0.0)
            time.sleep(_POLL_S)
        assert self._code is not None
        return self._code

    def send_signal(self, sig: int) -> None:
        if self._code is not None:
            return
        if not self._pid:
            self._pending.append(sig)
            self._await_start(0)
            return
        self.actor.signal.remote(self._pid, int(sig))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def log_tail(self, lines: int = 12) -> str:
        try:
            return str(self.ray.get(self.actor.log_tail.remote(lines), timeout=CALL_TIMEOUT_S))
        except Exception:  # the actor is gone (and its log on its node with it)
            return ""

    def _await_start(self, timeout: float) -> None:
        if self._pid or self._code is not None:
            return
        ready, _ = self.ray.wait([self.started], timeout=timeout)
        if not ready:
            return
        try:
            pid, node, _ = self.ray.get(self.started)
        except self.ray.exceptions.RayError:  # its actor died, or could never be created
            self._code = -signal.SIGKILL
            return
        self._pid, self._node = int(pid), str(node)
        self._exit = self.actor.wait_exit.remote(self._pid)
        for sig in self._pending:
            self.actor.signal.remote(self._pid, int(sig))
        self._pending.clear()

    def _take(self, ref: Any) -> None:
        try:
            code = self.ray.get(ref)
        except self.ray.exceptions.RayError:  # kill -9 of the actor: the role died with it
            self._code = -signal.SIGKILL
            return
        if code is None:  # still running: ask again
            self._exit = self.actor.wait_exit.remote(self._pid)
        else:
            self._code = int(code)


class RayHosts:
    """Roles as Ray actors across the cluster ``config.ray.address`` names."""

    def __init__(self, config: RunConfig) -> None:
        self.config, self.run_id = config, ""
        self.ray = import_ray()
        self._actor_class: Any = None
        self._groups: dict[str, Any] = {}
        self._actors: list[Any] = []
        self._here = ""

    # -- connecting and reserving room ------------------------------------------------------

    def open(self, run_id: str) -> None:
        """Join the cluster as its driver and reserve room for the servers and workers; a
        LaunchError says what is missing."""
        self.run_id = run_id
        ray, settings = self.ray, self.config.ray
        options: dict[str, Any] = {"namespace": "psctl", "log_to_driver": False,
                                   "logging_level": "WARNING", "configure_logging": True}
        # Ray itself retries an unreachable head for minutes: ask first, briefly.
        options["address"] = (settings.address if settings.address != "auto"
                              else _auto_address())
        _probe(options["address"])
        try:
            ray.init(**options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise LaunchError(
                f"could not join the Ray cluster at {settings.address}: {exc}. Start one "
                f"(`ray start --head --node-ip-address ADDRESS`, or on one machine `python -m "
                f"engine.hosts.ray_local`), or pass its head's HOST:PORT with "
                f"--ray-address") from None
        self._here = ray.get_runtime_context().get_node_id()
        self._actor_class = ray.remote(RoleHost)
        self._reserve()

    def _reserve(self) -> None:
        cluster, settings = self.config.cluster, self.config.ray
        worker = {"CPU": settings.worker_cpus} | (
            {"GPU": settings.worker_gpus} if settings.worker_gpus else {})
        wanted = {"server": ([{"CPU": settings.server_cpus}] * cluster.servers, "SPREAD"),
                  "worker": ([worker] * cluster.workers, _STRATEGIES[settings.placement])}
        for role, (bundles, strategy) in wanted.items():
            self._groups[role] = self.ray.util.placement_group(
                bundles, strategy=strategy, name=f"psctl-{self.run_id[:8]}-{role}s")
        try:
            self.ray.get([group.ready() for group in self._groups.values()],
                         timeout=settings.start_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            have, nodes = self.ray.cluster_resources(), len(self.ray.nodes())
            self.close()
            raise LaunchError(
                f"the Ray cluster found no room for {cluster.servers} servers "
                f"({settings.server_cpus:g} CPU each, spread) and {cluster.workers} workers "
                f"({_describe(worker)} each, {settings.placement}) within "
                f"{settings.start_timeout_s:g} s; it has {_describe(have)} in "
                f"{nodes} nodes. Add nodes, or lower --worker-cpus, "
                f"--server-cpus or the counts") from None

    # -- Hosts ------------------------------------------------------------------------------

    def start(self, role: str, rank: int, args: list[str], env: RoleEnv, log: Path, *,
              announce: bool = False) -> RoleProcess:
        actor = self._actor_class.options(**self._placement(role, rank)).remote()
        self._actors.append(actor)
        started = actor.start.remote(args, dict(env.own), dict(env.defaults), str(log),
                                     False, announce)
        return RayRole(self.ray, actor, started, log)

    def restart(self, process: RoleProcess, role: str, rank: int, args: list[str],
                env: RoleEnv, log: Path) -> RoleProcess:
        """In the same actor, which Ray restarts after kill -9 of its process (the call waits
        in its queue until it is back); a LaunchError if it is gone for good."""
        assert isinstance(process, RayRole)
        started = process.actor.start.remote(args, dict(env.own), dict(env.defaults),
                                             str(log), True, False)
        role_process = RayRole(self.ray, process.actor, started, log)
        if role_process.poll() is not None:
            raise LaunchError(f"the actor of {role} {rank} is gone for good")
        return role_process

    def announcement(self, process: RoleProcess, timeout: float) -> str | None:
        assert isinstance(process, RayRole)
        try:
            pid, _, _ = self.ray.get(process.started, timeout=timeout)
            address = self.ray.get(process.actor.announcement.remote(pid, timeout),
                                   timeout=timeout + CALL_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError:
            return None
        except self.ray.exceptions.RayError as exc:
            raise LaunchError(f"the coordinator's actor could not start: {exc}") from None
        return None if address is None else str(address)

    def wave(self) -> int:
        return fresh_wave()  # each actor's process imports torch afresh

    def start_up(self) -> dict[str, Any]:
        return {"mode": "ray", "note": None}

    def close(self) -> None:
        """Remove the run's actors and placement groups and leave the cluster."""
        if not self.ray.is_initialized():
            return
        for actor in self._actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                continue
        for group in self._groups.values():
            try:
                self.ray.util.remove_placement_group(group)
            except Exception:  # never created, or removed with the cluster
                continue
        self._actors.clear()
        self._groups.clear()
        self.ray.shutdown()

    def _placement(self, role: str, rank: int) -> dict[str, Any]:
        """Where a role's actor goes, what it holds, and how often Ray may restart it."""
        settings, cluster = self.config.ray, self.config.cluster
        strategies = importlib.import_module("ray.util.scheduling_strategies")
        name = f"psctl-{self.run_id[:8]}-{role}-{rank}"
        common: dict[str, Any] = {"max_concurrency": 4, "name": name, "num_cpus": 0}
        if role == "coordinator":  # beside the driver: it writes the local database
            return common | {"scheduling_strategy": strategies.NodeAffinitySchedulingStrategy(
                node_id=self._here, soft=False)}
        if role == "evaluator":
            return common | {"num_cpus": settings.evaluator_cpus}
        restarts = self.config.fault.max_restarts
        if role == "server":
            common |= {"num_cpus": settings.server_cpus,
                       "max_restarts": restarts if cluster.replicas else 0}
        else:
            common |= {"num_cpus": settings.worker_cpus, "num_gpus": settings.worker_gpus,
                       "max_restarts": restarts}
        group = self._groups.get(role)
        count = cluster.servers if role == "server" else cluster.workers
        if group is None or rank >= count:  # joined a running job (psctl scale)
            return common | {"scheduling_strategy": "SPREAD"}
        return common | {"scheduling_strategy": strategies.PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=rank)}


def _auto_address() -> str:
    """The cluster ``auto`` means, as Ray finds it: RAY_ADDRESS, else the head `ray start`
    last began on this machine (it notes its address in a file)."""
    named = os.environ.get("RAY_ADDRESS", "").strip()
    if named.startswith("ray://"):
        raise LaunchError(f"RAY_ADDRESS={named} is a Ray client address, which psctl does not "
                          "use (its driver records the run locally): name the head's HOST:PORT")
    if named:
        return named
    note = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        return note.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        raise LaunchError(
            "--ray-address auto found no Ray cluster: RAY_ADDRESS is not set and `ray start "
            "--head` was not run on this machine. Start one (on one machine: `python -m "
            "engine.hosts.ray_local`), or pass --ray-address HOST:PORT") from None


def _probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise LaunchError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}): start its head "
            f"with `ray start --head --node-ip-address HOST --port PORT`, or check "
            f"--ray-address") from None


def _describe(resources: dict[str, Any]) -> str:
    shown = [f"{float(resources[key]):g} {key}" for key in ("CPU", "GPU") if key in resources]
    return ", ".join(shown) or "no CPUs"
