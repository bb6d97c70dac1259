"""The body of the Ray actor that runs one role: a small supervisor on the node Ray chose.

It starts ``python -m engine.roles`` as its child there (the role asks the kernel to kill it
should this actor die: kill -9 of the actor takes its role along, and Ray's restart of the
actor lets the launcher start the role again in it), writes the role's output to a log on that
node, and answers the launcher's questions about it. Ray is the control plane only: the role
talks to the others over psctl's websockets. This module does not import Ray (the driver wraps
the class with ``ray.remote``), so it is tested without a cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from engine.hosts import RoleEnv, read_announcement, tail, with_node

# How long wait_exit blocks per call before it answers "still running" (the launcher asks
# again): an actor call must never hang for the whole run on a connection that went away.
WAIT_SLICE_S = 30.0


class RoleHost:
    def __init__(self) -> None:
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._log: Path | None = None

    def where(self) -> tuple[str, str, int]:
        """This node's address (as Ray knows it), this machine's name and this actor's pid."""
        import ray

        node = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        return node, socket.gethostname(), os.getpid()

    def start(self, args: list[str], own: Mapping[str, str], defaults: Mapping[str, str],
              log: str, append: bool = False, announce: bool = False,
              node: str | None = None) -> tuple[int, str, str]:
        """Start the role (its arguments' ``NODE`` becomes this node's address); its pid, the
        node address and the machine's name."""
        address, machine, _ = (node, socket.gethostname(), 0) if node else self.where()
        path = Path(log)
        path.parent.mkdir(parents=True, exist_ok=True)
        env = RoleEnv(own, defaults).over(os.environ)
        with path.open("ab" if append else "wb") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "engine.roles", *with_node(args, address)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if announce else handle,
                stderr=handle, env=env, start_new_session=True)
        self._processes[process.pid] = process
        self._log = path
        return process.pid, address, machine

    def announcement(self, pid: int, timeout: float) -> str | None:
        return read_announcement(self._processes[pid], timeout)

    def wait_exit(self, pid: int, timeout: float = WAIT_SLICE_S) -> int | None:
        """The role's exit code, or None if it still runs after ``timeout``."""
        try:
            return self._processes[pid].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, pid: int, sig: int) -> None:
        """Signal our own child, never another process."""
        process = self._processes.get(pid)
        if process is not None and process.poll() is None:
            process.send_signal(signal.Signals(sig))

    def log_tail(self, lines: int = 12) -> str:
        return "" if self._log is None else tail(self._log, lines)
