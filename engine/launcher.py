"""Start every process of a run on this machine, watch them, and make sure none outlives it.

The launcher writes nothing to the database: the coordinator process owns the recorder. The
launcher only steps in when the coordinator ended without recording how (it died, or its recorder
failed), marking the run failed (or interrupted) through the recorder's one-shot ``mark_ended``;
it attaches to the coordinator (``engine.transport.attach``) to be told when each wave of roles
joined, which ranks ``psctl scale`` added and how the run ended, and to tell it which roles
ended for good. Every child runs in its own session, so a
terminal Ctrl-C reaches the launcher alone and shutdown happens in order; every child also asks
the kernel to kill it should the launcher die (see ``engine.roles.lifecycle``).

``engine.stopping`` ends the processes of a run from outside (``psctl runs rm --force``).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import RunConfig
from engine.datasets.sources import label
from engine.db.schema import open_engine
from engine.errors import LaunchError, PsctlError, RunFailed, RunNotFound, StoreError
from engine.hosts import NODE, Hosts, RoleEnv, RoleProcess, roles_own_environment
from engine.hosts.local import LocalHosts
from engine.hosts.template import TemplateHosts, template_available
from engine.policies.optimizers import DRIVES_TRAINING, SERVER_OPTIMIZERS
from engine.recorder import Recorder
from engine.roles.checkpoints import checkpoint_folder
from engine.transport.admission import credential
from engine.transport.attach import Attachment
from engine.transport.control import Lost
from engine.wire.messages import MAX_START_S, Joined, RoleEnded, RunEnded, StartRoles, StartUp
from engine.wire.records import RunStatus

ANNOUNCE_TIMEOUT_S = 30.0
SHUTDOWN_GRACE_S = 3.0
# The longest a wave may take to join before the next starts anyway (a role that dies before it
# joins must not hold the others back; the coordinator's join deadline reports it).
WAVE_JOIN_WAIT_S = 10.0
_POLL_S = 0.1
# How long the launcher waits, once the coordinator ended, for its word on how the run ended
# (it reads the database without it).
LAST_WORD_WAIT_S = 2.0
_WHY_CHARS = 2000  # RoleEnded.why's bound
# Signals a process dies of by its own fault (not kill -9 or the OOM killer): the same one twice
# with the same last words is a crash a restart meets again.
_CRASH_SIGNALS = frozenset(-s for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                                        signal.SIGILL, signal.SIGABRT))
_RESTART_MARK = "--- psctl:"
_LAST_WORDS_LINES = 3
_LAST_WORDS_CHARS = 600


@dataclass
class Child:
    role: str
    rank: int
    process: RoleProcess
    log: Path
    args: tuple[str, ...] = ()
    restarts: int = 0
    crash: tuple[int, str] | None = None  # how its last restarted life ended: code, last words
    ended: bool = False  # it ended for good, and the coordinator was told why
    why: str | None = None  # what the coordinator was told, if it ended while the run went on

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}" if self.role in ("server", "worker") else self.role

    def log_tail(self, lines: int = 12) -> str:
        return self.process.log_tail(lines)

    def last_words(self) -> str:
        """The last line it wrote to its log, or a note that it wrote none."""
        return self.log_tail(1).strip() or f"nothing in {self.log}"

    def dying_words(self, lines: int = _LAST_WORDS_LINES) -> str:
        """The last lines its present life wrote (after psctl's note that it was restarted)."""
        tail = self.log_tail(12).splitlines()
        marks = [i for i, line in enumerate(tail) if line.startswith(_RESTART_MARK)]
        own = [line.strip() for line in tail[marks[-1] + 1 if marks else 0:] if line.strip()]
        return " | ".join(own[-lines:])


@dataclass(frozen=True)
class LaunchResult:
    run_id: str
    status: RunStatus
    reason: str | None
    logs: Path
    failed_children: tuple[str, ...] = ()
    processes: int = 0  # how many processes the run had (all of them have ended)


def default_run_name(config: RunConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # Sandblaster's asp is only how its pushes land: the method is what names the run.
    method = (config.optimizer.name if SERVER_OPTIMIZERS.can(config.optimizer.name,
                                                              DRIVES_TRAINING)
              else config.sync.model)
    return (f"{method}-w{config.cluster.workers}s{config.cluster.servers}-"
            f"{label(config.data.dataset)}-{stamp}")


class NewRun:
    """What every backend gives a run it starts: its config, database, a fresh id, its name
    and its log folder (``psctl-logs/<run id>`` beside the database unless ``logs_root``)."""

    def __init__(self, config: RunConfig, *, db: Path, logs_root: Path | None = None,
                 requested_at: float | None = None) -> None:
        """``requested_at``: when the user asked for the run (the command's start), from which
        its start-up is measured; when the launcher starts it, if not given."""
        self.requested_at = requested_at
        self.config = config
        self.db = db.resolve()
        self.run_id = uuid.uuid4().hex
        self.name = config.name or default_run_name(config)
        self.logs = (logs_root or self.db.parent / "psctl-logs") / self.run_id


@dataclass(frozen=True)
class ResumePoint:
    """An ended run to continue (``psctl resume``): its id, name, folder and checkpoint."""

    run_id: str
    name: str
    folder: Path  # the run's log folder, which holds its checkpoints
    checkpoint: Path
    seq: int


class Launcher(NewRun):
    """Starts a run's roles on ``hosts`` (children of this process by default), watches them,
    restarts the ones the run lets it, and makes sure none outlives the run."""

    def __init__(self, config: RunConfig, *, db: Path, logs_root: Path | None = None,
                 resume: ResumePoint | None = None, hosts: Hosts | None = None,
                 requested_at: float | None = None) -> None:
        super().__init__(config, db=db, logs_root=logs_root, requested_at=requested_at)
        self.resume = resume
        if resume is not None:  # the same run, its rows and logs going on
            self.run_id, self.name, self.logs = resume.run_id, resume.name, resume.folder
        self.hosts: Hosts = hosts or self._local_hosts(append=resume is not None)
        self.children: list[Child] = []
        self._token = secrets.token_urlsafe(32)
        self._interrupted = False
        self._address: str | None = None
        self._link: Attachment | None = None
        self._joined = 0  # processes the coordinator admitted, as it told
        self._wanted: dict[str, list[int]] = {"worker": [], "server": []}  # psctl scale's ranks
        self._end: RunEnded | None = None  # how the run ended, as the coordinator told
        self._start_up = StartUpClock(requested_at)

    def _local_hosts(self, *, append: bool) -> Hosts:
        if self.config.cluster.template and template_available():
            data = self.config.data
            return TemplateHosts(self.config.cluster.host, self._shared_environment(),
                                 self.logs, data=(data.dataset, data.data_dir,
                                                  data.train_limit, data.hash_features),
                                 append=append)
        return LocalHosts(self.config.cluster.host, append=append)

    @property
    def join_token(self) -> str:
        """The run's secret; tools that join the run (and tests) present it."""
        return self._token

    def start(self) -> None:
        """Start the coordinator, then the servers, the evaluator and the workers, in waves."""
        self._start_up.mark("launcher")
        self.hosts.open(self.run_id)
        self.logs.mkdir(parents=True, exist_ok=True)
        config_path = self.logs / "config.json"
        config_path.write_text(json.dumps(self.config.to_json_dict(), indent=2))
        resume = [] if self.resume is None else [
            "--resume-from", str(self.resume.checkpoint), "--resume-seq", str(self.resume.seq)]
        coordinator = self._spawn("coordinator", 0, [
            "coordinator", "--config", str(config_path), "--run-id", self.run_id,
            "--name", self.name, "--db", str(self.db), "--host", NODE, *resume], announce=True)
        address = self._address = self._await_announcement(coordinator)
        self._start_up.mark("coordinator")
        self._link = self._attach(coordinator, address)
        try:
            self._start_roles(address)
        except KeyboardInterrupt:  # starting a hundred roles takes minutes: Ctrl-C ends it all
            self._interrupted = True
            coordinator.process.send_signal(signal.SIGTERM)

    def _start_roles(self, address: str) -> None:
        roles = [("server", r) for r in range(self.config.cluster.servers)]
        roles += [("evaluator", 0)] + [("worker", r) for r in range(self.config.cluster.workers)]
        size = self.hosts.wave()
        self._start_up.roles = len(roles)
        for first in range(0, len(roles), size):
            if first and not self._await_joined(first):
                return  # the coordinator ended: wait() reports why
            for role, rank in roles[first:first + size]:
                self._spawn(role, rank, self._role_args(role, rank, address))
        self._start_up.mark("roles_started")

    def _role_args(self, role: str, rank: int, address: str) -> list[str]:
        return [role, "--coordinator", address, "--rank", str(rank), "--host", NODE,
                "--max-frame-bytes",
                str(self.config.cluster.max_frame_bytes)]

    def _await_joined(self, started: int) -> bool:
        """Wait (at most WAVE_JOIN_WAIT_S) until the roles started so far joined, or died;
        whether the coordinator is still there to start more for."""
        deadline = time.monotonic() + WAVE_JOIN_WAIT_S
        while time.monotonic() < deadline and self.children[0].process.poll() is None:
            dead = sum(c.process.poll() is not None for c in self.children[1:])
            if self._joined + dead >= started:
                break
            self._hear(_POLL_S)
        return self.children[0].process.poll() is None

    def _attach(self, coordinator: Child, address: str) -> Attachment:
        try:
            return Attachment.open(address, "launcher", token=self._token,
                                   timeout=ANNOUNCE_TIMEOUT_S)
        except LaunchError as exc:
            self.stop_all(grace_s=0)
            self.hosts.close()
            raise LaunchError(f"{exc} (log {coordinator.log}):\n{coordinator.log_tail()}") from None

    def _hear(self, wait_s: float) -> None:
        """Take what the coordinator told, waiting at most ``wait_s`` for the first word."""
        link = self._link
        if link is None:
            time.sleep(wait_s)
            return
        message = link.next(wait_s)
        while message is not None:
            if isinstance(message, Lost):  # it ended (or died): the database says how
                self._link = None
                link.close()
                return
            if isinstance(message, Joined):
                self._joined = max(self._joined, message.count)
                self._report_start_up()
            elif isinstance(message, StartRoles):
                self._wanted = {"worker": message.workers, "server": message.servers}
            elif isinstance(message, RunEnded):
                self._end = message
            message = link.next(0)

    def _report_start_up(self) -> None:
        """Once every role started first has joined, tell the coordinator where start-up went
        (it records it as the run's ``start_up`` event)."""
        clock = self._start_up
        if clock.told or not clock.roles or self._joined < clock.roles or self._link is None:
            return
        clock.mark("joined")
        clock.told = True
        with contextlib.suppress(PsctlError):  # it is gone: the run's end says why
            self._link.send(clock.report(self.hosts.start_up()))

    def _tell_ended(self, child: Child, why: str) -> None:
        """Tell the coordinator that ``child`` will not come back, and why."""
        if self._link is None or self.children[0].process.poll() is not None:
            return
        child.why = why[:_WHY_CHARS]
        with contextlib.suppress(PsctlError):  # it is gone: its rejoin timeout ends the run
            self._link.send(RoleEnded.model_validate(
                {"role": child.role, "rank": child.rank, "why": child.why}))

    def wait(self, on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> LaunchResult:
        """Block until the run ends (Ctrl-C interrupts it cleanly); never leaves a child behind."""
        try:
            while self.children[0].process.poll() is None:
                self._watch_roles()
                self._spawn_newcomers()
                if on_tick is not None:
                    on_tick()
                self._hear(tick_s)
        except KeyboardInterrupt:
            self._interrupted = True
            self.children[0].process.send_signal(signal.SIGTERM)
        finally:
            try:
                self.stop_all()
            except KeyboardInterrupt:  # Ctrl-C again while stopping: no more grace
                self._interrupted = True
                self.stop_all(grace_s=0)
            self.hosts.close()
        self._await_last_word()
        return self._result()

    def _await_last_word(self) -> None:
        """The coordinator ended: what it told last (how the run ended) may still be on its way
        to this process; the connection's end says when nothing more comes."""
        deadline = time.monotonic() + LAST_WORD_WAIT_S
        while self._link is not None and self._end is None and time.monotonic() < deadline:
            self._hear(_POLL_S)
        if self._link is not None:
            self._link.close()
            self._link = None

    def _watch_roles(self) -> None:
        """Reap the roles that ended (none lingers <defunct>), restart those the run lets it,
        and tell the coordinator why any other ended with an error."""
        for child in self.children[1:]:
            if child.ended or child.process.poll() is None:
                continue
            if self._restartable(child):
                self._restart(child)
                continue
            child.ended = True
            # Code 0 too: a role leaves when it is told to (or done), and the coordinator,
            # which knows which, fails the run at once for one that just went away.
            self._tell_ended(child, self._end_of(child, child.process.returncode or 0))

    def _end_of(self, child: Child, code: int) -> str:
        """Why ``child`` ended for good, in words, with the last lines it wrote."""
        words = child.dying_words()[-_LAST_WORDS_CHARS:] or f"nothing in {child.log}"
        if code == 0:
            return (f"exited with code 0 while the run went on (a role ends when it is done "
                    f"or told to: something in its code ended the process, which a restart "
                    f"would not mend): {words}")
        if code > 0:
            return f"exited with code {code}: {words}"
        how = f"was killed by {signal_name(code)}"
        if child.crash == (code, child.dying_words()):
            return (f"{how} again after a restart, with the same last words, so it is not "
                    f"restarted again: {words}")
        return f"{how} and was not restarted: {words}"

    def _spawn_newcomers(self) -> None:
        """Workers and servers the coordinator added to the job (``psctl scale``) that are not
        started."""
        for role in ("worker", "server"):
            started = {c.rank for c in self.children if c.role == role}
            for rank in self._wanted[role]:
                if rank not in started and self._address is not None:
                    self._spawn(role, rank, self._role_args(role, rank, self._address))

    def _restartable(self, child: Child) -> bool:
        """A worker, the evaluator, or a server of a run with replicas (its keys failed over;
        started again, it takes copies back), killed by a signal (kill -9, the OOM killer)
        while the run goes on; one that exits with an error, or crashes the same way again,
        failed for a reason a restart would meet again."""
        code = child.process.returncode
        role_restarts = child.role in ("worker", "evaluator") or (
            child.role == "server" and self.config.cluster.replicas > 0)
        return (role_restarts and code is not None and code < 0
                and child.restarts < self.config.fault.max_restarts
                and not self._same_crash_again(child, code)
                and self.children[0].process.poll() is None)

    @staticmethod
    def _same_crash_again(child: Child, code: int) -> bool:
        return code in _CRASH_SIGNALS and child.crash == (code, child.dying_words())

    def _restart(self, child: Child) -> None:
        """The same role again, in the same place in ``children``, logging on in its log."""
        code = child.process.returncode or 0
        child.crash = (code, child.dying_words())
        with contextlib.suppress(OSError), child.log.open("ab") as handle:
            handle.write(f"\n{_RESTART_MARK} {child.label} was killed by {signal_name(code)} "
                         f"({code}); restarting it\n".encode())
        child.restarts += 1
        try:
            child.process = self.hosts.restart(child.process, child.role, child.rank,
                                               list(child.args),
                                               self._environment(child.role, child.rank),
                                               child.log)
        except LaunchError as exc:  # its host is gone too: the run goes on without it
            with contextlib.suppress(OSError), child.log.open("ab") as handle:
                handle.write(f"{_RESTART_MARK} could not restart {child.label}: {exc}\n".encode())
            child.ended = True
            self._tell_ended(child, f"could not be restarted: {exc}")

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

    def _failed_children(self, reason: str | None) -> tuple[str, ...]:
        """The roles to name as failed: the one whose end, as the launcher told it, is the
        run's reason; else those that ended with an error while the run went on; else every
        role that exited with an error. A failed run's stopping ends the others mid-step, some
        with an error: they went down with the run, and are not named before its cause."""
        # Stopping an interrupted run ends its roles mid-step, and some exit non-zero on the
        # way out: that is the interruption working, not a process failing.
        # Roles that lost a killed coordinator exit non-zero too: that is its death, not theirs.
        if self._interrupted or (self.children[0].process.returncode or 0) < 0:
            return ()
        told = [(c, c.why) for c in self.children[1:] if c.why is not None]
        return (tuple(c.label for c, why in told if reason is not None and why in reason)
                or tuple(c.label for c, _ in told if c.process.returncode != 0)
                or tuple(c.label for c in self.children[1:]
                         if c.process.returncode not in (0, None, -signal.SIGKILL)))

    def _result(self) -> LaunchResult:
        told = self._end
        if told is not None and told.recorded:  # the coordinator recorded it: the run's record
            return LaunchResult(self.run_id, RunStatus(told.status), told.reason, self.logs,
                                self._failed_children(told.reason), len(self.children))
        status, guess = self._unrecorded_end()
        reason: str | None = guess
        # A no-op when the coordinator recorded the end itself; it did not if it died, or if
        # its recorder failed and the run row took no fresh write either.
        try:
            Recorder.mark_ended(self.db, self.run_id, status, guess)
        except StoreError as exc:
            reason = f"{guess}; it could not be recorded either: {exc}"
        recorded = self._recorded_end_patiently()
        if recorded is not None and recorded[0] not in (RunStatus.RUNNING, RunStatus.CRASHED):
            status, reason = recorded
        return LaunchResult(self.run_id, status, reason, self.logs,
                            self._failed_children(reason), len(self.children))

    def _unrecorded_end(self) -> tuple[RunStatus, str]:
        """How the run ended as far as the launcher can tell, should the database not say."""
        coordinator = self.children[0]
        code = coordinator.process.returncode
        if self._interrupted:
            return RunStatus.INTERRUPTED, "interrupted by the user"
        if code in (0, 1, 130):
            return RunStatus.FAILED, (f"the coordinator could not record the run's end: "
                                      f"{coordinator.last_words()}")
        if code is not None and code < 0:
            return RunStatus.FAILED, (f"the coordinator was killed by {signal_name(code)}; "
                                      f"{self._resume_hint()}")
        return RunStatus.FAILED, (f"the coordinator exited with code {code}: "
                                  f"{coordinator.last_words()}; {self._resume_hint()}")

    def _resume_hint(self) -> str:
        """How to go on with a run whose coordinator died."""
        if checkpoint_folder(self.logs, 0).parent.is_dir() and any(
                checkpoint_folder(self.logs, 0).parent.iterdir()):
            return (f"continue it from its last checkpoint with psctl resume "
                    f"{self.run_id[:8]}")
        return ("it saved no checkpoint to resume from (launch with --checkpoint-every "
                "SECONDS to have them); see its log")

    def _recorded_end(self) -> tuple[RunStatus, str | None] | None:
        """The status and reason in the database; raises RunFailed if the run row is gone."""
        from engine.db.queries import run_detail

        try:
            engine = open_engine(self.db, readonly=True)
            try:
                detail = run_detail(engine, self.run_id)
            finally:
                engine.dispose()
        except RunNotFound:
            coordinator = self.children[0]
            raise RunFailed(
                f"run {self.run_id[:8]} ({self.name}) is no longer in {self.db} (deleted while "
                f"it ran?), so how it ended could not be recorded; the coordinator exited with "
                f"code {coordinator.process.returncode} ({coordinator.last_words()}); every "
                f"process of the run has ended; logs in {self.logs}") from None
        except StoreError:
            return None
        return RunStatus(detail.summary.status), detail.reason

    def _recorded_end_patiently(self, attempts: int = 5,
                                pause_s: float = 0.4) -> tuple[RunStatus, str | None] | None:
        """``_recorded_end``, read again a few times while the database cannot be read (a busy
        machine) or the row still says running: the coordinator's last write may be landing."""
        recorded = None
        for attempt in range(attempts):
            recorded = self._recorded_end()
            if recorded is not None and recorded[0] not in (RunStatus.RUNNING,
                                                            RunStatus.CRASHED):
                return recorded
            if attempt + 1 < attempts:
                time.sleep(pause_s)
        return recorded

    def _spawn(self, role: str, rank: int, args: list[str], *, announce: bool = False) -> Child:
        log = self.logs / (f"{role}-{rank}.log" if role in ("server", "worker") else f"{role}.log")
        process = self.hosts.start(role, rank, args, self._environment(role, rank), log,
                                   announce=announce)
        child = Child(role, rank, process, log, tuple(args))
        self.children.append(child)
        return child

    def _environment(self, role: str, rank: int) -> RoleEnv:
        shared = self._shared_environment()
        own = dict(shared.own)
        # Only the processes that admit others hold the run's secret; a worker or the evaluator
        # gets a credential for itself alone, so it cannot speak for any other process.
        if role in ("coordinator", "server"):
            own["PSCTL_TOKEN"] = self._token
        else:
            own["PSCTL_CREDENTIAL"] = credential(self._token, role, rank)
        return RoleEnv(own, shared.defaults)

    def _shared_environment(self) -> RoleEnv:
        """Every role's environment but its secret (the template's, too)."""
        threads = str(self.config.train.torch_threads)
        return RoleEnv(roles_own_environment(),
                       {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})

    def _await_announcement(self, coordinator: Child) -> str:
        address = self.hosts.announcement(coordinator.process, ANNOUNCE_TIMEOUT_S)
        if address is not None:
            return address
        self.stop_all(grace_s=0)
        self.hosts.close()
        raise LaunchError(f"the coordinator did not start (log {coordinator.log}):\n"
                          f"{coordinator.log_tail()}")


def signal_name(code: int) -> str:
    """SIGKILL for -9: how a process killed by a signal (a negative return code) ended."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass
class StartUpClock:
    """The moments of a run's start-up, from the command's start (``origin``)."""

    origin: float | None
    moments: dict[str, float] = field(default_factory=dict)
    roles: int = 0  # how many roles the launcher starts first (they must all join)
    told: bool = False

    def mark(self, moment: str) -> None:
        now = time.time()
        if self.origin is None:
            self.origin = now
        self.moments[moment] = now

    def report(self, hosts: dict[str, Any]) -> StartUp:
        origin = self.origin if self.origin is not None else time.time()
        at = {**hosts.get("at", {}), **self.moments}
        note = hosts.get("note")
        return StartUp.model_validate({
            "mode": hosts["mode"], "note": str(note)[:1000] if note else None, "origin": origin,
            "at": {name: _seconds(when - origin) for name, when in at.items()},
            "took": {name: _seconds(float(span)) for name, span in hosts.get("took", {}).items()}})


def _seconds(value: float) -> float:
    return round(min(max(value, 0.0), MAX_START_S), 4)
