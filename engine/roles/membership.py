"""Workers joining and leaving a running job (``psctl scale RUN --workers N``).

``psctl scale`` attaches to the run's coordinator and asks for a number of workers. The
coordinator decides which ranks join (new ranks, never reused) and which leave (the highest),
answers, and tells the launcher (attached too) every rank that should exist, so that it starts
the newcomers. A newcomer joins the servers at the clock its consistency model gives it and
trains on its share of the data for the epochs left; a leaver is told to stop, finishes its
iteration, and leaves the servers' accounting once its last push is in.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.consistency.registry import CHANGING_WORKERS, CONSISTENCY_MODELS
from engine.errors import ConfigError, StoreError

CONTROL_CREDENTIAL = "control.credential"
MAX_WORKERS = 256
MAX_SERVERS = 64
# The consistency models whose servers can count a changing set of workers.
SCALABLE_MODELS = CONSISTENCY_MODELS.able(CHANGING_WORKERS)
# Learning rules that keep per-worker state sized when the job starts.
FIXED_RULES = ("adaptive", "split")


def check_servers_scalable(servers: int, target: int, ranges: int, replicas: int) -> None:
    """Whether a job with ``ranges`` key ranges and ``replicas`` can run on ``target``
    servers (the moves themselves have their own refusals: ``Moves.move_refusal``)."""
    if target < replicas + 1:
        raise ConfigError(f"{target} servers cannot hold the {replicas + 1} copies of each key "
                          f"range (cluster.replicas = {replicas})")
    if target > ranges:
        raise ConfigError(f"the job's keys are cut into {ranges} ranges, so at most {ranges} "
                          "servers can each serve one; start the job with more "
                          "(--key-ranges, at most 64 per server) to add servers")


def check_scalable(model: str, rule: str, push_every: int = 1) -> None:
    if not CONSISTENCY_MODELS.can(model, CHANGING_WORKERS):
        raise ConfigError(f"a {model} job cannot change its workers: {model} counts a fixed set "
                          f"of workers in every round; psctl scale works with "
                          f"{', '.join(SCALABLE_MODELS)}")
    if push_every > 1:
        raise ConfigError("a job whose workers push every few iterations (train.push_every) "
                          "counts its clocks in pushes; it cannot change its workers")
    if rule in FIXED_RULES:
        raise ConfigError(f"learning.rule {rule} keeps per-worker state sized at the start, so "
                          "its job cannot change its workers")


def check_count(role: str, count: int) -> None:
    """The bounds of a ``psctl scale`` request, checked where it is made and where it lands."""
    most = MAX_WORKERS if role == "workers" else MAX_SERVERS
    if not 1 <= count <= most:
        raise ConfigError(f"--{role} {count}: a job has 1 to {most} {role}")


def write_control_credential(folder: Path, credential: str) -> None:
    """What admits ``psctl scale`` (and nothing else) to the run: a file only the run's user
    can read, in the run's folder (``psctl scale`` finds it there)."""
    path = folder / CONTROL_CREDENTIAL
    partial = path.with_name(path.name + ".partial")
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(credential)
        os.replace(partial, path)
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from None


def read_control_credential(folder: Path) -> str:
    path = folder / CONTROL_CREDENTIAL
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise StoreError(f"cannot read the run's credential for psctl scale ({path}): "
                         f"{exc.strerror or exc}") from None


class Membership:
    """Which worker ranks are in the job, joining or leaving."""

    def __init__(self, workers: int) -> None:
        self.active = set(range(workers))
        self.started = set(range(workers))
        self._first = workers  # every rank ever started (ranks are not reused)
        self.joining: set[int] = set()
        self.leaving: set[int] = set()

    @property
    def scaled(self) -> bool:
        """Has the job changed its workers? (Then workers that are done leave the servers'
        accounting, since the others may have more iterations to run.)"""
        return len(self.started) != self._first or self.active != self.started

    def scale_to(self, target: int) -> tuple[list[int], list[int]]:
        """(ranks that join, ranks that leave) to have ``target`` workers."""
        current = sorted(self.active)
        if target > len(current):
            first = max(self.started) + 1
            joining = list(range(first, first + target - len(current)))
            self.active |= set(joining)
            self.started |= set(joining)
            self.joining |= set(joining)
            return joining, []
        leaving = current[target:]
        self.active -= set(leaving)
        self.leaving |= set(leaving)
        return [], leaving
