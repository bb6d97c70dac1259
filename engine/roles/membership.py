"""Workers joining and leaving a running job (``psctl scale RUN --workers N``).

``psctl scale`` writes the wanted worker count to ``scale.json`` in the run's folder. The
coordinator reads it, decides which ranks join (new ranks, never reused) and which leave (the
highest), and writes the ranks that should exist to ``spawn.json``, which the launcher reads to
start the newcomers. A newcomer joins the servers at the clock its consistency model gives it and
trains on its share of the data for the epochs left; a leaver is told to stop, finishes its
iteration, and leaves the servers' accounting once its last push is in.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from engine.consistency.registry import CHANGING_WORKERS, CONSISTENCY_MODELS
from engine.errors import ConfigError, StoreError

SCALE_FILE = "scale.json"
SERVERS_FILE = "scale-servers.json"  # psctl scale --servers: its own request
SPAWN_FILE = "spawn.json"
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


def write_json(path: Path, value: dict[str, object]) -> None:
    """Atomically, so a reader never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(json.dumps(value))
        os.replace(partial, path)
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from None


def request_scale(folder: Path, workers: int) -> None:
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"--workers {workers}: a job has 1 to {MAX_WORKERS} workers")
    write_json(folder / SCALE_FILE, {"workers": workers, "requested_at": time.time()})


def read_count(path: Path, key: str) -> object | None:
    """``key`` of the JSON object in ``path``, or None if there is none (yet, or unreadable:
    a request being replaced is read again at the next poll)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value.get(key) if isinstance(value, dict) else None


def wanted_workers(folder: Path) -> tuple[int, float] | None:
    """The latest request: (workers, when it was made), if there is a valid one."""
    return _wanted(folder / SCALE_FILE, "workers", MAX_WORKERS)


def request_servers(folder: Path, servers: int) -> None:
    if not 1 <= servers <= MAX_SERVERS:
        raise ConfigError(f"--servers {servers}: a job has 1 to {MAX_SERVERS} servers")
    write_json(folder / SERVERS_FILE, {"servers": servers, "requested_at": time.time()})


def wanted_servers(folder: Path) -> tuple[int, float] | None:
    """The latest ``psctl scale --servers`` request: (servers, when it was made)."""
    return _wanted(folder / SERVERS_FILE, "servers", MAX_SERVERS)


def _wanted(path: Path, key: str, most: int) -> tuple[int, float] | None:
    count, at = read_count(path, key), read_count(path, "requested_at")
    if (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= most
            and isinstance(at, float)):
        return count, at
    return None


def ranks_to_spawn(folder: Path, role: str = "worker") -> list[int]:
    """The ranks of ``role`` the coordinator wants to exist (the launcher starts those it has
    not started)."""
    ranks = read_count(folder / SPAWN_FILE, "ranks" if role == "worker" else "servers")
    if not isinstance(ranks, list):
        return []
    return [r for r in ranks if isinstance(r, int) and not isinstance(r, bool)
            and 0 <= r < 2**20]


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
