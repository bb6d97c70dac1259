"""Roles forked from a warm template process on this machine (``engine.roles.template``).

The template is the launcher's child; the roles are the template's, so it reaps them and says
how each ended; ``TemplateProcess`` gives the launcher ``subprocess.Popen``'s words over that.
The coordinator is forked as soon as the template has its modules (before torch), and says
where it listens in a file beside its log; the other roles once the template has imported
torch and loaded the run's data set. Where the template cannot start (not Linux, or it fails)
or dies, roles start as fresh processes.
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
from engine.hosts import (
    MIN_WAVE,
    RoleEnv,
    RoleProcess,
    roles_own_environment,
    tail,
    with_node,
)
from engine.hosts.local import LocalHosts
from engine.proctime import usable_cores

log = logging.getLogger(__name__)

# Importing torch and psctl takes 1-2 CPU-seconds idle, many more on a machine already busy
# with a run's roles; a template not warm by then is not faster than a fresh start.
READY_TIMEOUT_S = 60.0
FORK_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
# With the template gone, how often a wait looks whether a role it forked has ended.
GONE_POLL_S = 0.02
# What a template started before its run's folder may write before it has its log.
HELD_BYTES = 1 << 20
_ONE_THREAD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Roles forked at once, per core: each still connects, builds its model and joins.
FORKS_PER_CPU = 16
# How often the launcher looks for a forked coordinator's address file.
ADDRESS_POLL_S = 0.01


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
    # Each stage's reply (what it took) and when it came, in this process's wall time.
    warm: dict[int, dict[str, Any]] = field(default_factory=dict)
    preload: dict[str, Any] = field(default_factory=dict)


class _Held:
    """A pipe's bytes, held in memory (at most ``HELD_BYTES``; the rest is dropped and said)
    until a file is named, then written there."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._lock = threading.Lock()
        self._kept = bytearray()
        self._dropped = 0
        self._file: IO[bytes] | None = None
        self._thread = threading.Thread(target=self._pump, args=(stream,),
                                        name="psctl-template-log", daemon=True)
        self._thread.start()

    def into(self, path: Path) -> None:
        with self._lock:
            self._file = path.open("ab")
            self._file.write(bytes(self._kept))
            if self._dropped:
                self._file.write(f"[psctl: {self._dropped} bytes dropped before the run "
                                 f"had a folder]\n".encode())
            self._file.flush()
            self._kept.clear()

    def close(self) -> None:
        self._thread.join(CLOSE_TIMEOUT_S)
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _pump(self, stream: IO[bytes]) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            with self._lock:
                if self._file is not None:
                    self._file.write(chunk)
                    self._file.flush()
                elif len(self._kept) + len(chunk) <= HELD_BYTES:
                    self._kept += chunk
                else:
                    self._dropped += len(chunk)
        stream.close()


class Template:
    """The running template and the thread that reads its replies."""

    def __init__(self, env: Mapping[str, str], log_path: Path | None) -> None:
        """``log_path`` None: what it writes is held (``_Held``) until ``keep_log`` names the
        file (a template started before its run has a folder)."""
        self._replies = _Replies()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.started_at = time.time()
        # Nothing may start a thread in the template before it forks (a BLAS pool would):
        # one thread unless set; each role sets its own torch threads.
        env = {**{name: "1" for name in _ONE_THREAD}, **env}
        self._held: _Held | None = None
        if log_path is None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "engine.roles.template"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True)
            assert self.process.stderr is not None
            self._held = _Held(self.process.stderr)
        else:
            with log_path.open("ab") as handle:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "engine.roles.template"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=handle, env=env, start_new_session=True)
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

    def wait_warm(self, stage: int, timeout: float) -> bool:
        """Whether the template is warm for the roles of ``stage`` (within ``timeout``)."""
        with self._replies.condition:
            self._replies.condition.wait_for(
                lambda: stage in self._replies.warm or self._replies.gone, timeout)
            return stage in self._replies.warm and not self._replies.gone

    @property
    def gone(self) -> bool:
        """It ended (its replies may not all have been read yet)."""
        return self._replies.gone or self.process.poll() is not None

    def stages(self) -> dict[int, dict[str, Any]]:
        """Each stage done so far: what it said it took, and ``at`` (when it said so)."""
        with self._replies.condition:
            return {stage: dict(reply) for stage, reply in self._replies.warm.items()}

    def keep_log(self, log_path: Path) -> None:
        """From now on (and what it wrote so far) its log is ``log_path``."""
        if self._held is not None:
            self._held.into(log_path)

    def preload(self, dataset: str, data_dir: str | None, train_limit: int | None,
                hash_features: int | None = None) -> None:
        """Ask the template to load the run's data set before it forks the roles that use it."""
        self._send({"preload": {"dataset": dataset, "data_dir": data_dir,
                                "train_limit": train_limit, "hash_features": hash_features}})

    def preloaded(self) -> dict[str, Any]:
        """What the template said of the data set it loaded (nothing yet, if it did not)."""
        with self._replies.condition:
            return dict(self._replies.preload)

    def _send(self, request: dict[str, Any]) -> None:
        try:
            with self._lock:
                self._stdin.write(json.dumps(request).encode() + b"\n")
                self._stdin.flush()
        except OSError as exc:
            raise LaunchError(f"the template process is gone ({exc})") from exc

    def fork(self, args: list[str], env: Mapping[str, str], log_path: Path,
             append: bool, timeout: float = FORK_TIMEOUT_S) -> int:
        """Ask for a role and wait (at most ``timeout``) for its pid: a role the template is
        not warm for yet waits in its queue."""
        ident = next(self._ids)
        self._send({"id": ident, "args": args, "env": dict(env), "log": str(log_path),
                    "append": append})
        with self._replies.condition:
            self._replies.condition.wait_for(
                lambda: ident in self._replies.pids or self._replies.gone, timeout)
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
        if self._held is not None:
            self._held.close()

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
            elif "preloaded" in message or "preload_error" in message:
                self._replies.preload = message
            elif isinstance(message.get("warm"), int):
                self._replies.warm[message["warm"]] = {**message, "at": time.time()}
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
    announce: Path | None = None  # where a forked coordinator writes its address

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
            # The template may have reaped it since it last told us: it ended meanwhile (a
            # second Ctrl-C's kill of every role once raised here on a busy machine).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def log_tail(self, lines: int = 12) -> str:
        return tail(self.log, lines)


class TemplateHosts(LocalHosts):
    """Like ``LocalHosts``, but every role is forked from a template started when the run
    opens: the coordinator once the template is warm for it (before torch), the others once it
    is warm for all."""

    def __init__(self, host: str, template_env: RoleEnv, logs: Path, *,
                 data: DataToLoad | None = None, append: bool = False) -> None:
        super().__init__(host, append=append)
        self._template_env = template_env
        self._data = data
        self._logs = logs
        self._template: Template | None = None
        self._usable: bool | None = None
        self._fallback: str | None = None  # why roles started as fresh processes, if they did

    def open(self, run_id: str) -> None:
        self._logs.mkdir(parents=True, exist_ok=True)
        self._template = claim_early(self._logs / "template.log")
        try:
            if self._template is None:
                self._template = Template(self._template_env.over(os.environ),
                                          self._logs / "template.log")
            if self._data is not None:
                self._template.preload(*self._data)
        except (OSError, LaunchError) as exc:
            self._give_up(f"no template process ({exc})")

    def start(self, role: str, rank: int, args: list[str], env: RoleEnv, log: Path, *,
              announce: bool = False) -> RoleProcess:
        if announce and self._template is not None and self._usable is not False:
            return self._fork_coordinator(args, env, log)
        if announce or not self._ready():
            return super().start(role, rank, args, env, log, announce=announce)
        return self._fork(args, env, log, self.append)

    def restart(self, process: RoleProcess, role: str, rank: int, args: list[str],
                env: RoleEnv, log: Path) -> RoleProcess:
        if not self._ready():
            return super().restart(process, role, rank, args, env, log)
        return self._fork(args, env, log, True)

    def announcement(self, process: RoleProcess, timeout: float) -> str | None:
        if not isinstance(process, TemplateProcess) or process.announce is None:
            return super().announcement(process, timeout)
        return read_address_file(process, process.announce, timeout)

    def close(self) -> None:
        if self._template is not None:
            self._template.close()
            self._template = None

    def wave(self) -> int:
        """Forked roles start in milliseconds and share what they import: larger waves."""
        if self._usable is False:
            return super().wave()
        return max(MIN_WAVE, FORKS_PER_CPU * usable_cores())

    def start_up(self) -> dict[str, Any]:
        """What the template did and when (wall times), for the run's start-up event."""
        if self._template is None:
            return {"mode": "fresh", "note": self._fallback}
        stages = self._template.stages()
        took = {f"template_stage_{stage}_s": float(reply.get("import_s", 0.0))
                for stage, reply in stages.items()}
        at = {f"template_stage_{stage}": float(reply["at"]) for stage, reply in stages.items()}
        data = self._template.preloaded()
        if "data_s" in data:
            took["data_s"] = float(data["data_s"])
        return {"mode": "template" if self._fallback is None else "fresh",
                "note": self._fallback or data.get("preload_error"),
                "at": {"template": self._template.started_at, **at}, "took": took}

    def _fork_coordinator(self, args: list[str], env: RoleEnv, log: Path) -> RoleProcess:
        """Asked at once: the template forks it as soon as it is warm for it, and it writes
        where it listens into a file beside its log."""
        assert self._template is not None
        address = _address_file(log)
        address.unlink(missing_ok=True)  # a resumed run's, from its last life
        try:
            return self._fork([*args, "--announce-file", str(address)], env, log, self.append,
                              announce=address, timeout=READY_TIMEOUT_S)
        except LaunchError as exc:
            # Nothing was forked: the template goes, so that it never forks this one late.
            self._template.process.kill()
            self._give_up(f"the template did not start the coordinator ({exc})")
            return super().start("coordinator", 0, args, env, log, announce=True)

    def _ready(self) -> bool:
        if self._usable is None:
            self._usable = self._template is not None and self._template.wait_ready(
                READY_TIMEOUT_S)
            if not self._usable and self._fallback is None:
                self._give_up("the template process did not start (see template.log)")
        return self._usable

    def _give_up(self, why: str) -> None:
        log.warning("%s: roles start as fresh processes", why)
        self._usable = False
        self._fallback = why

    def _fork(self, args: list[str], env: RoleEnv, log: Path, append: bool, *,
              announce: Path | None = None, timeout: float = FORK_TIMEOUT_S) -> RoleProcess:
        assert self._template is not None
        try:
            pid = self._template.fork(with_node(args, self.host), env.over(os.environ), log,
                                      append, timeout)
        except LaunchError as exc:
            if not self._template.gone or announce is not None:
                raise
            # The template died (killed, say): the run goes on with fresh processes.
            self._give_up(str(exc))
            return self._popen(args, env, log, "ab" if append else "wb")
        return TemplateProcess(self._template, pid, log, self.host, announce=announce)


def _address_file(log: Path) -> Path:
    return log.with_suffix(".address")


def read_address_file(process: RoleProcess, path: Path, timeout: float) -> str | None:
    """The coordinator's address from the file it writes once it listens (a forked
    coordinator's stdout is its log): None if it ended or wrote none within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = path.read_text()
        except OSError:
            line = ""
        if line.startswith("PSCTL_COORDINATOR ") and line.endswith("\n"):
            return line.split()[1]
        if process.poll() is not None:
            return None
        time.sleep(ADDRESS_POLL_S)
    return None


# The data set the template loads for the roles: its name, folder, training limit and the space
# a hashed file's features are hashed into.
DataToLoad = tuple[str, str | None, int | None, int | None]

# A template started before the run's configuration was resolved (``start_early``), waiting
# for the run that claims it; at most one, in the process that runs ``psctl launch``.
_early: Template | None = None


def start_early() -> None:
    """Start the template now, while the command line still resolves and checks the run's
    configuration (half a second of the user's wait): the run's ``TemplateHosts`` claims it,
    and ``discard_early`` ends it if none does (the run turned out not to want one, or was
    refused: nothing is written for a refused run, so what the template says is held until
    the run's folder exists)."""
    global _early
    if _early is not None or not template_available():
        return
    try:
        _early = Template(RoleEnv(roles_own_environment()).over(os.environ), None)
    except OSError as exc:
        log.warning("the template could not start early (%s)", exc)


def claim_early(log_path: Path) -> Template | None:
    """The template started early, logging from now on to ``log_path``; None if there is
    none."""
    global _early
    template, _early = _early, None
    if template is not None:
        template.keep_log(log_path)
    return template


def discard_early() -> None:
    """End a template started early that no run claimed."""
    global _early
    template, _early = _early, None
    if template is not None:  # it forked nothing: nothing to wait for
        template.process.kill()
        template.close()
