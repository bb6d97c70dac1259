"""Stopping a run from outside its launcher (``psctl runs rm --force``).

The run's events record the pid of its coordinator and of every role that joined. A pid is
signalled only when its command line and start time prove it still is that process of that run,
and through a pidfd, so a pid the kernel reused for something else is never hit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from engine.db.schema import events, open_engine, runs, translate_errors
from engine.errors import LaunchError, RunNotFound

# SIGTERM asks the coordinator to record the end and dismiss every role (about a second); what
# is left after this is killed, so that every process has ended within 10 s.
STOP_GRACE_S = 6.0
KILL_WAIT_S = 2.0
# /proc start times are whole clock ticks after a boot time in whole seconds.
_START_SLACK_S = 2.0
# The events that name a role process's pid as it joins (a restarted one's too).
_JOINS = ("process_joined", "worker_rejoined", "evaluator_rejoined")
_POLL_S = 0.1


@dataclass(frozen=True)
class RunProcess:
    """A process of a run on this machine, as its events recorded it, and how to prove that a
    pid still is that process: its role and arguments, and when it may have started."""

    pid: int
    role: str
    label: str
    arguments: tuple[tuple[str, str], ...]  # (--flag, value) its command line must hold
    started_between: tuple[float, float]

    def alive(self) -> bool:
        """Whether the pid is still this process: not gone, not a zombie, not reused."""
        argv = _command_line(self.pid)
        if "engine.roles" not in argv:
            return False
        position = argv.index("engine.roles")
        if argv[position + 1:position + 2] != [self.role]:
            return False
        if any(_option(argv, flag) != value for flag, value in self.arguments):
            return False
        started = _process_started(self.pid)
        return started is not None and (
            self.started_between[0] <= started <= self.started_between[1])


def run_processes(db: Path, run_id: str) -> list[RunProcess]:
    """The processes of ``run_id`` alive on this machine: its coordinator (which records its
    pid when it starts listening) and the roles that joined it (each said its pid)."""
    started_at, recorded = _launch_events(db, run_id)
    found: list[RunProcess] = []
    address: str | None = None
    here = socket.gethostname()  # as roles report their machine (engine.roles.lifecycle)
    # In order: a resumed run has a coordinator of each start, each with the roles that joined
    # it; the coordinator started (shortly) before it recorded that it listens.
    for at, kind, detail in recorded:
        pid, role, rank = detail.get("pid"), detail.get("role", "worker"), detail.get("rank")
        if not isinstance(pid, int) or detail.get("machine") not in (None, "", here):
            continue  # a role on another machine (a Ray cluster): its pid is not ours
        if kind == "coordinator_listening":
            address = str(detail.get("address"))
            found.append(RunProcess(pid, "coordinator", "coordinator", (("--run-id", run_id),),
                                    (0.0, max(at, started_at) + _START_SLACK_S)))
        elif kind in _JOINS and address is not None:
            found.append(RunProcess(pid, str(role), f"{role} {rank}",
                                    (("--coordinator", address), ("--rank", str(rank))),
                                    (started_at - _START_SLACK_S, float("inf"))))
    return [process for process in found if process.alive()]


def stop_run(db: Path, run_id: str, *, grace_s: float = STOP_GRACE_S) -> list[RunProcess]:
    """End every process of ``run_id`` on this machine; those that were alive.

    The coordinator is asked first (SIGTERM: it records the end, dismisses every role, and its
    launcher then reaps them); whatever outlives ``grace_s`` is killed. Raises LaunchError if a
    process may not be signalled or outlives even that.
    """
    found = run_processes(db, run_id)
    coordinators = [process for process in found if process.role == "coordinator"]
    for process in coordinators or found:
        _signal(process, signal.SIGTERM)
    left = _await_gone(found, grace_s)
    for process in left:
        _signal(process, signal.SIGKILL)
    left = _await_gone(left, KILL_WAIT_S)
    if left:
        names = ", ".join(f"{p.label} (pid {p.pid})" for p in left)
        raise LaunchError(f"could not stop {names} of run {run_id[:8]}")
    return found


def _launch_events(db: Path,
                   run_id: str) -> tuple[float, list[tuple[float, str, dict[str, Any]]]]:
    """The run's start and its events that name pids, oldest first, with their times."""
    start = sa.select(runs.c.started_at).where(runs.c.id == run_id)
    query = sa.select(events.c.at, events.c.kind, events.c.detail).where(
        events.c.run_id == run_id,
        events.c.kind.in_(("coordinator_listening", *_JOINS)),
    ).order_by(events.c.id)
    engine = open_engine(db, readonly=True)
    try:
        with translate_errors(f"reading the processes of run {run_id}"), \
                engine.connect() as conn:
            started_at = conn.execute(start).scalar()
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    if started_at is None:
        raise RunNotFound(f"no run {run_id} in {db}")
    found = []
    for at, kind, detail in rows:
        with contextlib.suppress(ValueError):
            parsed = json.loads(detail)
            if isinstance(parsed, dict):
                found.append((float(at), str(kind), parsed))
    return float(started_at), found


def _signal(process: RunProcess, sig: int) -> None:
    # The pidfd pins the process before it is checked, so a pid reused after the check is never
    # signalled (where pidfds are missing, the check-then-kill window is microseconds).
    try:
        pidfd: int | None = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds here (not Linux, or a kernel before 5.3)
        pidfd = None
    try:
        if not process.alive():
            return
        if pidfd is None:
            os.kill(process.pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        raise LaunchError(f"may not signal {process.label} (pid {process.pid}): it belongs to "
                          f"another user") from None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _await_gone(processes: list[RunProcess], timeout_s: float) -> list[RunProcess]:
    deadline = time.monotonic() + timeout_s
    left = [process for process in processes if process.alive()]
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = [process for process in left if process.alive()]
    return left


def _command_line(pid: int) -> list[str]:
    """Its arguments; none for a process that is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    argv = raw.decode(errors="replace").rstrip("\0").split("\0")
    # A role forked from the launcher's template names itself with its whole command line in
    # one title (setproctitle): its arguments are words without spaces.
    return argv[0].split() if len(argv) == 1 else argv


def _option(argv: list[str], flag: str) -> str | None:
    if flag not in argv[:-1]:
        return None
    return argv[argv.index(flag) + 1]


def _process_started(pid: int) -> float | None:
    """When the process started (unix time), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        # The command name in parentheses may hold spaces: fields are counted after its ")".
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None
