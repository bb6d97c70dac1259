"""Roles forked from a warm template process on this machine (``engine.roles.template``).

The template is the launcher's child; the roles are the template's, so it reaps them and says
how each ended; ``TemplateProcess`` gives the launcher ``subprocess.Popen``'s words over that.
Where the template cannot start (not Linux, or it fails), roles start as fresh processes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from engine.errors import LaunchError
from engine.hosts import RoleEnv, RoleProcess, tail, with_node
from engine.hosts.local import LocalHosts

log = logging.getLogger(__name__)

# Importing torch and psctl takes 1-2 CPU-seconds idle, many more on a machine already busy
# with a run's roles; a template not warm by then is not faster than a fresh start.
READY_TIMEOUT_S = 60.0
FORK_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
# With the template gone, how often a wait looks whether a role it forked has ended.
GONE_POLL_S = 0.02


def template_available() -> bool:
    """Fork (without exec) is safe and supported here: Linux, where psctl's roles run."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


@dataclass
class _Replies:
    """What the template said so far, read by one thread and awaited by others."""

    condition: threading.Condition = field(default_factory=threading.Condition)
    pids: dict[int, int | str] = field(default_factory=dict)  # request id -> pid or error
    codes: dict[int, int] = field(default_factory=dict)  # pid -> exit code
    ready: int | None = None
    gone: bool = False


class Template:
    """The running template and the thread that reads its replies."""

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self._replies = _Replies()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        with log_path.open("ab") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "engine.roles.template"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=handle, env=dict(env), start_new_session=True)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,),
                                        name="psctl-template", daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float) -> bool:
        with self._replies.condition:
            self._replies.condition.wait_for(
                lambda: self._replies.ready is not None or self._replies.gone, timeout)
            return self._replies.ready is not None and not self._replies.gone

    def fork(self, args: list[str], env: Mapping[str, str], log_path: Path,
             append: bool) -> int:
        ident = next(self._ids)
        request = {"id": ident, "args": args, "env": dict(env), "log": str(log_path),
                   "append": append}
        try:
            with self._lock:
                self._stdin.write(json.dumps(request).encode() + b"\n")
                self._stdin.flush()
        except OSError as exc:
            raise LaunchError(f"the template process is gone ({exc})") from exc
        with self._replies.condition:
            self._replies.condition.wait_for(
                lambda: ident in self._replies.pids or self._replies.gone, FORK_TIMEOUT_S)
            reply = self._replies.pids.pop(ident, None)
        if not isinstance(reply, int):
            raise LaunchError(f"the template did not start {args[0]}: "
                              f"{reply or 'it ended or did not answer'}")
        return reply

    def exit_code(self, pid: int, timeout: float | None = 0.0) -> int | None:
        """``pid``'s exit code once the template reaped it; None while it runs (or if the
        template died: its roles die with it, and are counted killed)."""
        with self._replies.condition:
            self._replies.condition.wait_for(
                lambda: pid in self._replies.codes or self._replies.gone, timeout)
            if pid in self._replies.codes:
                return self._replies.codes[pid]
            gone = self._replies.gone
        if gone and _alive(pid) and (timeout is None or timeout > 0):
            # No reply will say when it ends: look again shortly rather than at once, so that
            # a wait on it does not spin.
            time.sleep(GONE_POLL_S if timeout is None else min(timeout, GONE_POLL_S))
        return -signal.SIGKILL if gone and not _alive(pid) else None

    def close(self) -> None:
        """Let go: the template exits once the roles it forked have ended."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self.process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(CLOSE_TIMEOUT_S)
        self._reader.join(CLOSE_TIMEOUT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            try:
                message: dict[str, Any] = json.loads(line)
            except ValueError:
                log.warning("the template said something unreadable: %r", line[:200])
                continue
            self._take(message)
        with self._replies.condition:
            self._replies.gone = True
            self._replies.condition.notify_all()

    def _take(self, message: dict[str, Any]) -> None:
        with self._replies.condition:
            if "ready" in message:
                self._replies.ready = int(message["ready"])
            elif "exit" in message:
                self._replies.codes[int(message["exit"])] = int(message["code"])
            elif isinstance(message.get("id"), int):
                self._replies.pids[message["id"]] = message.get("pid") or str(
                    message.get("error"))
            self._replies.condition.notify_all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@dataclass
class TemplateProcess:
    """A role forked by the template, in ``subprocess.Popen``'s words."""

    template: Template
    pid: int
    log: Path
    node: str
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.template.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self.returncode is None:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                self.returncode = self.template.exit_code(self.pid, left)
                if self.returncode is None and left is not None and left <= 0.0:
                    raise subprocess.TimeoutExpired(f"role {self.pid}", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid reused after it ended
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def log_tail(self, lines: int = 12) -> str:
        return tail(self.log, lines)


class TemplateHosts(LocalHosts):
    """Like ``LocalHosts``, but workers, servers and the evaluator are forked from a template
    started when the run opens; the coordinator (which announces its address on stdout) starts
    as before, meanwhile."""

    def __init__(self, host: str, template_env: RoleEnv, logs: Path, *,
                 append: bool = False) -> None:
        super().__init__(host, append=append)
        self._template_env = template_env
        self._logs = logs
        self._template: Template | None = None
        self._usable: bool | None = None

    def open(self, run_id: str) -> None:
        self._logs.mkdir(parents=True, exist_ok=True)
        try:
            self._template = Template(self._template_env.over(os.environ),
                                      self._logs / "template.log")
        except OSError as exc:
            log.warning("no template process (%s): roles start as fresh processes", exc)

    def start(self, role: str, rank: int, args: list[str], env: RoleEnv, log: Path, *,
              announce: bool = False) -> RoleProcess:
        if announce or not self._ready():
            return super().start(role, rank, args, env, log, announce=announce)
        return self._fork(args, env, log, self.append)

    def restart(self, process: RoleProcess, role: str, rank: int, args: list[str],
                env: RoleEnv, log: Path) -> RoleProcess:
        if not self._ready():
            return super().restart(process, role, rank, args, env, log)
        return self._fork(args, env, log, True)

    def close(self) -> None:
        if self._template is not None:
            self._template.close()
            self._template = None

    def _ready(self) -> bool:
        if self._usable is None:
            self._usable = self._template is not None and self._template.wait_ready(
                READY_TIMEOUT_S)
            if not self._usable:
                log.warning("the template process did not start (see template.log): roles "
                            "start as fresh processes")
        return self._usable

    def _fork(self, args: list[str], env: RoleEnv, log: Path, append: bool) -> TemplateProcess:
        assert self._template is not None
        pid = self._template.fork(with_node(args, self.host), env.over(os.environ), log, append)
        return TemplateProcess(self._template, pid, log, self.host)
