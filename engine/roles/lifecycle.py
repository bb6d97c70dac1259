"""Process hygiene shared by every role: die with the launcher, log to stderr, report a crash."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time

from engine.proctime import process_started_at
from engine.transport.admission import credential
from engine.wire.messages import MAX_START_S, Hello, RoleName

_PR_SET_PDEATHSIG = 1
# glibc's mallopt parameters, and the values the launcher gives every role in its environment
# (engine.hosts.MALLOC_ENV: large frames stay mapped instead of being returned and faulted
# in again, measured 25-47 % more push/pull throughput).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_BYTES, _MMAP_BYTES = 268435456, 33554432
# When this process was forked from the warm template (engine.roles.template), if it was.
_forked_at: float | None = None


def mark_forked() -> None:
    """Called first thing in a role the template forked: its start is the fork."""
    global _forked_at
    _forked_at = time.time()


def started() -> tuple[float, bool]:
    """When this process started (its fork from the template, or its own start as a fresh
    process), and whether it was forked from the template."""
    if _forked_at is not None:
        return _forked_at, True
    return process_started_at(), False


def die_with_parent(sig: int = signal.SIGKILL, *, parent: int | None = None) -> None:
    """Ask Linux to send ``sig`` when the launcher dies, so no role outlives it (no orphans);
    ``parent``: the process it must die with (its parent now, if not given), which may have
    died already."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def keep_large_blocks_mapped() -> None:
    """The launcher's allocator settings, for a role started without them in its environment
    (by hand, ``psctl role``); a no-op off glibc or where the environment set them."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_BYTES)
    except (OSError, AttributeError):
        return


def setup_logging(role: str, rank: int) -> None:
    logging.basicConfig(
        level=os.environ.get("PSCTL_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {role}-{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def join_token(role: str, rank: int) -> str:
    """What this process presents when it connects, passed in the environment so that it never
    shows up in ``ps``: its own credential (``PSCTL_CREDENTIAL``), or the run's secret
    (``PSCTL_TOKEN``) for the roles that admit others (the coordinator and the shard servers)."""
    token = os.environ.get("PSCTL_TOKEN", "")
    if role in ("coordinator", "server"):
        if not token:
            sys.exit(f"PSCTL_TOKEN is not set: a {role} needs the run's secret to admit others; "
                     "roles are started by `psctl launch`, which passes it in the environment")
        return token
    offered = os.environ.get("PSCTL_CREDENTIAL", "")
    if offered:
        return offered
    if token:  # started by hand by the operator, who holds the secret
        return credential(token, role, rank)
    sys.exit(f"PSCTL_CREDENTIAL is not set: a {role} presents its own credential; roles are "
             "started by `psctl launch`, which passes it in the environment")


def this_machine() -> str:
    """This machine's name, as roles report it: a pid is only meaningful on its own machine."""
    return socket.gethostname()


def hello(role: RoleName, rank: int, node: str) -> Hello:
    """How a role introduces itself: who, its pid, and where it runs (``node``: the address it
    binds, so that the events record which node each role ran on)."""
    began, forked = started()
    return Hello(role=role, rank=rank, pid=os.getpid(), node=node, machine=this_machine(),
                 start_s=min(max(time.time() - began, 0.0), MAX_START_S), forked=forked)
