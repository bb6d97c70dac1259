"""Start every process of a run on this machine, watch them, and make sure none outlives it.

The launcher writes nothing to the database: the coordinator process owns the recorder. The
launcher only steps in when the coordinator itself died, marking the run failed (or interrupted)
through the recorder's one-shot ``mark_ended``. Every child runs in its own session, so a
terminal Ctrl-C reaches the launcher alone and shutdown happens in order; every child also asks
the kernel to kill it should the launcher die (see ``engine.roles.lifecycle``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.config import RunConfig
from engine.errors import LaunchError
from engine.recorder import Recorder
from engine.wire.records import RunStatus

ANNOUNCE_TIMEOUT_S = 30.0
SHUTDOWN_GRACE_S = 3.0
# Measured on this machine kind: glibc returning and re-faulting 4 MB frames costs ~2 ms per
# round trip; keeping large blocks mapped raised push/pull throughput by 25-47 %.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}


@dataclass
class Child:
    role: str
    rank: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}" if self.role in ("server", "worker") else self.role

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass(frozen=True)
class LaunchResult:
    run_id: str
    status: RunStatus
    reason: str | None
    logs: Path
    failed_children: tuple[str, ...] = ()


def default_run_name(config: RunConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (f"{config.sync.model}-w{config.cluster.workers}s{config.cluster.servers}-"
            f"{config.data.dataset}-{stamp}")


class Launcher:
    def __init__(self, config: RunConfig, *, db: Path, logs_root: Path | None = None) -> None:
        self.config = config
        self.db = db.resolve()
        self.run_id = uuid.uuid4().hex
        self.name = config.name or default_run_name(config)
        self.logs = (logs_root or self.db.parent / "psctl-logs") / self.run_id
        self.children: list[Child] = []
        self._token = secrets.token_urlsafe(32)
        self._interrupted = False

    @property
    def join_token(self) -> str:
        """The run's secret; tools that join the run (and tests) present it."""
        return self._token

    def start(self) -> None:
        """Start the coordinator, then the servers, the evaluator and the workers."""
        self.logs.mkdir(parents=True, exist_ok=True)
        config_path = self.logs / "config.json"
        config_path.write_text(json.dumps(self.config.to_json_dict(), indent=2))
        coordinator = self._spawn("coordinator", 0, [
            "coordinator", "--config", str(config_path), "--run-id", self.run_id,
            "--name", self.name, "--db", str(self.db), "--host", self.config.cluster.host,
        ], stdout=subprocess.PIPE)
        address = self._await_announcement(coordinator)
        roles = [("server", r) for r in range(self.config.cluster.servers)]
        roles += [("evaluator", 0)] + [("worker", r) for r in range(self.config.cluster.workers)]
        for role, rank in roles:
            self._spawn(role, rank, [
                role, "--coordinator", address, "--rank", str(rank), "--host",
                self.config.cluster.host, "--max-frame-bytes",
                str(self.config.cluster.max_frame_bytes)])

    def wait(self, on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> LaunchResult:
        """Block until the run ends (Ctrl-C interrupts it cleanly); never leaves a child behind."""
        try:
            while self.children[0].process.poll() is None:
                if on_tick is not None:
                    on_tick()
                time.sleep(tick_s)
        except KeyboardInterrupt:
            self._interrupted = True
            self.children[0].process.send_signal(signal.SIGTERM)
        finally:
            self.stop_all()
        return self._result()

    def stop_all(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Let children exit on their own for ``grace_s``, then kill what is left."""
        deadline = time.monotonic() + grace_s
        for child in self.children:
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                child.process.wait(remaining)
            except subprocess.TimeoutExpired:
                child.process.kill()
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL cannot be ignored
                child.process.wait(2.0)

    def _result(self) -> LaunchResult:
        failed = tuple(c.label for c in self.children[1:]
                       if c.process.returncode not in (0, None, -signal.SIGKILL))
        code = self.children[0].process.returncode
        if self._interrupted:
            Recorder.mark_ended(self.db, self.run_id, RunStatus.INTERRUPTED,
                                "interrupted by the user")
        elif code not in (0, 1, 130):
            tail = self.children[0].log_tail()
            Recorder.mark_ended(self.db, self.run_id, RunStatus.FAILED,
                                f"the coordinator exited with code {code}: {tail[-500:]}")
        from engine.db import open_engine
        from engine.db.queries import run_detail

        engine = open_engine(self.db, readonly=True)
        try:
            detail = run_detail(engine, self.run_id)
        finally:
            engine.dispose()
        status = RunStatus(detail.summary.status)
        return LaunchResult(self.run_id, status, detail.reason, self.logs, failed)

    def _spawn(self, role: str, rank: int, args: list[str], *,
               stdout: int | None = None) -> Child:
        log = self.logs / (f"{role}-{rank}.log" if role in ("server", "worker") else f"{role}.log")
        with log.open("wb") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "engine.roles", *args], stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else handle, stderr=handle,
                env=self._environment(), start_new_session=True)
        child = Child(role, rank, process, log)
        self.children.append(child)
        return child

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(_MALLOC_ENV)
        env["PSCTL_TOKEN"] = self._token
        env["PYTHONUNBUFFERED"] = "1"
        threads = str(self.config.train.torch_threads)
        env.setdefault("OMP_NUM_THREADS", threads)
        env.setdefault("MKL_NUM_THREADS", threads)
        return env

    def _await_announcement(self, coordinator: Child) -> str:
        stream = coordinator.process.stdout
        assert stream is not None
        deadline = time.monotonic() + ANNOUNCE_TIMEOUT_S
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([stream], [], [], 0.2)
            if ready:
                chunk = os.read(stream.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
            elif coordinator.process.poll() is not None:
                break
        if line.startswith(b"PSCTL_COORDINATOR "):
            return line.split()[1].decode()
        self.stop_all(grace_s=0)
        raise LaunchError(f"the coordinator did not start (log {coordinator.log}):\n"
                          f"{coordinator.log_tail()}")
