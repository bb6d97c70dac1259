"""Process hygiene shared by every role: die with the launcher, log to stderr, report a crash."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` when the launcher dies, so no role outlives it (no orphans)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def setup_logging(role: str, rank: int) -> None:
    logging.basicConfig(
        level=os.environ.get("PSCTL_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {role}-{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def join_token() -> str:
    """The run's join token, passed in the environment so it never shows up in ``ps``."""
    token = os.environ.get("PSCTL_TOKEN", "")
    if not token:
        sys.exit(
            "PSCTL_TOKEN is not set: roles are started by `psctl launch`, which passes the "
            "run's join token in the environment"
        )
    return token
