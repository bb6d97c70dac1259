"""A Ray cluster of several nodes on this one machine, each on its own loopback address.

For trying the Ray backend without machines to spare, and for the tests and benchmarks that
need a real cluster: ``python -m engine.hosts.ray_local --nodes 3`` starts a head on 127.0.0.4
and nodes on 127.0.0.2, 127.0.0.3, ... (never the machine's outside address), each a
``ray start --block`` process of its own, prints the head's address, and stops every one of
them, by the pids it started, on Ctrl-C. Ray's token authentication is on: its servers listen
on every interface of the machine, and the token keeps anyone who reaches them out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import LaunchError

HEAD = "127.0.0.4"
NODES = ("127.0.0.2", "127.0.0.3", "127.0.0.5", "127.0.0.6", "127.0.0.7")
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
# Heads started on a free port before the start is given up (LocalRayCluster._start_head).
HEAD_TRIES = 3
# The least object store Ray accepts: roles exchange tensors over websockets, not through it.
OBJECT_STORE_BYTES = 80 * 2**20


@dataclass
class LocalRayCluster:
    """``nodes`` Ray nodes (the head first) with ``cpus`` logical CPUs each."""

    nodes: int = 3
    cpus: float = 2
    logs: Path = Path("ray-local")
    # RAY_AUTH_TOKEN if the caller chose one (so that its shell can drive the cluster)
    token: str = field(default_factory=lambda: os.environ.get("RAY_AUTH_TOKEN")
                       or secrets.token_hex(32))
    port: int = 0  # the head's; 0: a free one
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    address: str = ""

    @property
    def env(self) -> dict[str, str]:
        """What a driver of this cluster needs in its environment (its token)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "RAY_USAGE_STATS_ENABLED": "0"}

    @property
    def node_addresses(self) -> list[str]:
        return [HEAD, *NODES[:self.nodes - 1]]

    def start(self) -> str:
        """Start the head, then the other nodes; the head's HOST:PORT."""
        if not 1 <= self.nodes <= len(NODES) + 1:
            raise LaunchError(f"a local Ray cluster has 1 to {len(NODES) + 1} nodes")
        ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if ray is None:
            raise LaunchError("the ray command is not installed: pip install 'psctl[ray]'")
        self.logs.mkdir(parents=True, exist_ok=True)
        common = ["--block", "--num-cpus", f"{self.cpus:g}", "--object-store-memory",
                  str(OBJECT_STORE_BYTES), "--disable-usage-stats"]
        self._start_head(ray, common)
        for address in NODES[:self.nodes - 1]:
            self._launch(ray, address, [ray, "start", "--address", self.address,
                                        "--node-ip-address", address, *common])
        return self.address

    def _start_head(self, ray: str, common: list[str]) -> None:
        """The head, on the chosen port or a free one. Ray's GCS listens on that port on every
        interface, while the probe can only ask HEAD's: a port another loopback address holds,
        or one taken between the probe and Ray's bind, fails its start; a free port is then
        tried again, up to HEAD_TRIES times."""
        for attempt in range(1 if self.port else HEAD_TRIES):
            port = self.port or _free_port(HEAD)
            self.address = f"{HEAD}:{port}"
            try:
                self._launch(ray, "head", [ray, "start", "--head", "--node-ip-address", HEAD,
                                           "--port", str(port), "--include-dashboard", "false",
                                           *common])
                return
            except LaunchError as exc:
                if attempt + 1 == HEAD_TRIES or self.port or not _port_taken(str(exc)):
                    raise

    def stop(self) -> None:
        """SIGTERM to each ``ray start --block`` we started (it stops its own Ray processes),
        SIGKILL to any that outlive STOP_TIMEOUT_S."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.processes.clear()

    def _launch(self, ray: str, name: str, command: list[str]) -> None:
        log = self.logs / f"ray-{name}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=handle,
                                       stderr=subprocess.STDOUT, env=os.environ | self.env,
                                       start_new_session=True)
        self.processes.append(process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"Ray runtime started" not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"Ray node {name} did not start; its log {log}:\n"
                                  f"{log.read_text(errors='replace')[-1500:]}")
            time.sleep(0.2)


@contextlib.contextmanager
def local_cluster(nodes: int = 3, cpus: float = 2, logs: Path = Path("ray-local"),
                  port: int = 0) -> Iterator[LocalRayCluster]:
    cluster = LocalRayCluster(nodes, cpus, logs, port=port)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _port_taken(log_tail: str) -> bool:
    """Whether a head's log says its port could not be bound."""
    return "Failed to start GCS" in log_tail or "already in use" in log_tail


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.hosts.ray_local",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus", type=float, default=2, help="logical CPUs per node")
    parser.add_argument("--port", type=int, default=0, help="the head's port (0: a free one)")
    parser.add_argument("--logs", type=Path, default=Path("ray-local"))
    args = parser.parse_args(argv)
    with local_cluster(args.nodes, args.cpus, args.logs, args.port) as cluster:
        told = "" if os.environ.get("RAY_AUTH_TOKEN") else (
            f"  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN={cluster.token}\n")
        print(f"Ray cluster of {args.nodes} nodes ({', '.join(cluster.node_addresses)}), "
              f"head at {cluster.address}\nIn another shell:\n{told}"
              f"  psctl launch --backend ray --ray-address {cluster.address} ...\n"
              f"Ctrl-C (or SIGTERM) stops it.", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
