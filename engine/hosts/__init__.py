"""Where a launcher runs each role's process: the launcher backend interface.

A launcher (``engine.launcher``) decides which roles to start, in which order, when to restart
one and how the run ended; a ``Hosts`` starts a role's process somewhere and gives back a
``RoleProcess`` to watch and stop it. ``engine.hosts.local`` starts children of the launcher on
this machine; ``engine.hosts.ray_cluster`` starts each role in a Ray actor on the node Ray
places it on. Either way the roles then talk to each other over psctl's websockets alone.
"""

from __future__ import annotations

import os
import select
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.proctime import usable_cores

# Stands for the role's own address in its arguments, filled in where the role runs (the node
# Ray placed it on, or cluster.host on this machine).
NODE = "{node}"
# The run's secrets never pass from one process's environment to another's by accident: each
# role gets exactly the one it needs.
SECRETS = ("PSCTL_TOKEN", "PSCTL_CREDENTIAL")
# The environment a role is started with names its own secret and place, never the launcher's.
_NOT_PASSED_ON = ("PSCTL_TOKEN", "PSCTL_CREDENTIAL", "PSCTL_COORDINATOR", "PSCTL_RANK")
# Measured on this machine kind: glibc returning and re-faulting 4 MB frames costs ~2 ms per
# round trip; keeping large blocks mapped raised push/pull throughput by 25-47 %.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}
# Fresh roles start in waves of this many per core: a hundred processes importing torch at once
# on two cores all take minutes to say hello, where waves join one after the other.
WAVE_PER_CPU = 2
MIN_WAVE = 4


@dataclass(frozen=True)
class RoleEnv:
    """What a role's environment gets from the launcher: ``own`` (its secret, its allocator
    settings) over the host's environment, ``defaults`` under it (thread counts the host may
    have set already)."""

    own: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)

    def over(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment on a host whose own is ``base`` (never passing on its secrets)."""
        env = dict(self.defaults)
        env.update({key: value for key, value in base.items() if key not in SECRETS})
        env.update(self.own)
        return env


class RoleProcess(Protocol):
    """One role's process, started by a ``Hosts`` (``subprocess.Popen``'s words)."""

    @property
    def pid(self) -> int: ...

    @property
    def node(self) -> str:
        """The address of the node it runs on."""
        ...

    @property
    def returncode(self) -> int | None:
        """Its exit code once it ended (negative: killed by that signal), else None."""
        ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; raises ``subprocess.TimeoutExpired`` if it runs past ``timeout``."""
        ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def log_tail(self, lines: int = 12) -> str:
        """The last lines of its log (empty if it cannot be read)."""
        ...


class Hosts(Protocol):
    """Starts roles' processes and stops what is left of them."""

    def open(self, run_id: str) -> None:
        """Reach the machines and reserve room for the run's roles; a LaunchError says what
        is missing."""
        ...

    def start(self, role: str, rank: int, args: list[str], env: RoleEnv, log: Path, *,
              announce: bool = False) -> RoleProcess:
        """``python -m engine.roles *args`` (``NODE`` replaced) in ``env`` over the host's own
        environment, writing to ``log``; ``announce``: its first stdout line is read by
        ``announcement`` instead."""
        ...

    def restart(self, process: RoleProcess, role: str, rank: int, args: list[str],
                env: RoleEnv, log: Path) -> RoleProcess:
        """The same role again, where it ran (appending to its log)."""
        ...

    def announcement(self, process: RoleProcess, timeout: float) -> str | None:
        """The coordinator's address from its first line, or None if it said none in time."""
        ...

    def close(self) -> None:
        """Let go of whatever the hosts hold (every process has ended by now)."""
        ...

    def wave(self) -> int:
        """How many roles may start at once (the launcher waits for a wave to join before it
        starts the next)."""
        ...

    def start_up(self) -> dict[str, Any]:
        """How this run's roles were started, for its start-up event: ``mode`` (template, fresh,
        ray), a ``note`` (why a template was not used), and, where there was one, the template's
        moments (``at``, wall times) and spans (``took``, seconds)."""
        ...


def roles_own_environment() -> dict[str, str]:
    """What every role's environment takes from the launcher's: the allocator's settings and
    the settings meant for the roles (the data folder, the log level), never the run's
    secrets, which travel with them to whichever host runs them."""
    own = dict(MALLOC_ENV)
    own.update({key: value for key, value in os.environ.items()
                if key.startswith("PSCTL_") and key not in _NOT_PASSED_ON})
    own["PYTHONUNBUFFERED"] = "1"
    return own


def fresh_wave() -> int:
    """A wave of fresh processes: a few per core."""
    return max(MIN_WAVE, WAVE_PER_CPU * usable_cores())


def with_node(args: list[str], node: str) -> list[str]:
    return [node if arg == NODE else arg for arg in args]


def read_announcement(process: subprocess.Popen[bytes], timeout: float) -> str | None:
    """The address in ``PSCTL_COORDINATOR ADDRESS``, the first line the coordinator prints."""
    import time

    stream = process.stdout
    if stream is None:
        return None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline and not line.endswith(b"\n"):
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            line += chunk
        elif process.poll() is not None:
            break
    if line.startswith(b"PSCTL_COORDINATOR ") and line.endswith(b"\n"):
        return line.split()[1].decode()
    return None


def tail(log: Path, lines: int) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])
