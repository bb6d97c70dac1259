"""How the launcher treats a role that ended, and what it says of a coordinator that died, with
stand-in processes (nothing is started): restarts for kills, word to the coordinator for an
error or a crash that repeats itself."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.launcher import Child, Launcher
from engine.plan import build_config
from engine.roles.checkpoints import checkpoint_folder
from engine.transport.control import Lost
from engine.wire.messages import Joined, Message, RoleEnded, RunEnded, StartRoles
from engine.wire.records import RunStatus

pytestmark = pytest.mark.timeout(30)


@dataclass
class Stand:
    """A role process as the launcher sees it: its return code and its log."""

    log: Path
    returncode: int | None = None
    pid: int = 4242
    node: str = "127.0.0.1"

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def log_tail(self, lines: int = 12) -> str:
        text = self.log.read_text() if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class StandHosts:
    restarted: list[tuple[str, int]] = field(default_factory=list)
    started: list[tuple[str, int]] = field(default_factory=list)

    def restart(self, process: Stand, role: str, rank: int, args: list[str], env: object,
                log: Path) -> Stand:
        self.restarted.append((role, rank))
        return Stand(log)

    def start(self, role: str, rank: int, args: list[str], env: object, log: Path, *,
              announce: bool = False) -> Stand:
        self.started.append((role, rank))
        return Stand(log)


@dataclass
class StandLink:
    """The launcher's connection to the coordinator: what it told, and what it is told."""

    sent: list[Message] = field(default_factory=list)
    inbox: list[Message | Lost] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)

    def send(self, message: Message) -> None:
        self.sent.append(message)

    def next(self, timeout: float) -> Message | Lost | None:
        self.waited.append(timeout)
        return self.inbox.pop(0) if self.inbox else None

    def close(self) -> None: ...

    def told(self, role: str, rank: int) -> str | None:
        """What the coordinator was told of ``role rank`` ending for good, if anything."""
        words = [m.why for m in self.sent
                 if isinstance(m, RoleEnded) and (m.role, m.rank) == (role, rank)]
        assert len(words) <= 1, words
        return words[0] if words else None


def launcher(tmp_path: Path, **values: object) -> tuple[Launcher, StandHosts]:
    hosts = StandHosts()
    run = build_config({}, {"data.dataset": "digits", **values})
    made = Launcher(run, db=tmp_path / "runs.db", hosts=hosts)  # type: ignore[arg-type]
    made.logs.mkdir(parents=True)
    made.children.append(Child("coordinator", 0, Stand(made.logs / "coordinator.log"),
                               made.logs / "coordinator.log"))
    made._link = StandLink()  # type: ignore[assignment]
    return made, hosts


def told(made: Launcher, role: str, rank: int) -> str | None:
    return made._link.told(role, rank)  # type: ignore[union-attr]


def role(made: Launcher, name: str, rank: int, code: int | None, words: str = "") -> Child:
    log = made.logs / f"{name}-{rank}.log"
    log.write_text(words)
    child = Child(name, rank, Stand(log, code), log)
    made.children.append(child)
    return child


def die(child: Child, code: int, words: str) -> None:
    with child.log.open("a") as handle:
        handle.write(words)
    child.process.returncode = code  # type: ignore[misc]


def test_a_role_that_exits_with_an_error_is_not_restarted_and_the_coordinator_is_told(
        tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    role(made, "worker", 1, 1, "loading\nTraceback ...\nValueError: NaN in features\n")
    made._watch_roles()
    assert hosts.restarted == []
    assert told(made, "worker", 1) == (
        "exited with code 1: loading | Traceback ... | ValueError: NaN in features")


def test_killed_workers_and_the_evaluator_are_restarted_and_nothing_is_noted(
        tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    role(made, "worker", 0, -signal.SIGKILL)
    role(made, "evaluator", 0, -signal.SIGKILL)
    role(made, "server", 0, -signal.SIGKILL)  # without replicas a server is not restarted
    made._watch_roles()
    assert hosts.restarted == [("worker", 0), ("evaluator", 0)]
    assert told(made, "worker", 0) is None and told(made, "evaluator", 0) is None
    assert told(made, "server", 0) == (
        f"was killed by SIGKILL and was not restarted: nothing in {made.logs}/server-0.log")
    assert "killed by SIGKILL (-9); restarting it" in (made.logs / "worker-0.log").read_text()


def test_a_role_that_exits_0_is_not_restarted_and_the_coordinator_is_told_with_its_code(
        tmp_path: Path) -> None:
    """Issue 57: a worker whose code ended its process with code 0 in the middle of the run
    stalled it until the rejoin timeout (65 s), and the summary named another worker. The
    coordinator is told (it ignores the word for a worker that said it was done), and the one
    whose end is the run's reason is the one named as failed; a worker that went down with the
    run is not."""
    made, hosts = launcher(tmp_path)
    quitter = role(made, "worker", 1, 0, "step 39\n")
    made._watch_roles()
    assert hosts.restarted == []
    why = told(made, "worker", 1)
    assert why == ("exited with code 0 while the run went on (a role ends when it is done or "
                   "told to: something in its code ended the process, which a restart would "
                   "not mend): step 39")
    bystander = role(made, "worker", 0, None)
    die(bystander, 1, "psctl worker 0: connection closed (code 1001: server shutting down)\n")
    made.children[0].process.returncode = 1  # type: ignore[misc]
    made._end = RunEnded(status="failed", reason=f"worker 1 {why}", recorded=True)
    assert made._result().failed_children == ("worker 1",)
    assert quitter.process.returncode == 0


def test_a_crash_that_repeats_itself_after_a_restart_is_not_restarted_again(
        tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    child = role(made, "worker", 1, -signal.SIGSEGV, "Fatal Python error: Segmentation fault\n")
    made._watch_roles()
    assert hosts.restarted == [("worker", 1)]
    die(child, -signal.SIGSEGV, "Fatal Python error: Segmentation fault\n")
    made._watch_roles()
    assert hosts.restarted == [("worker", 1)]
    assert told(made, "worker", 1) == (
        "was killed by SIGSEGV again after a restart, with the same last words, so it is not "
        "restarted again: Fatal Python error: Segmentation fault")


def test_a_crash_with_other_last_words_or_a_kill_again_is_restarted(tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    crashed = role(made, "worker", 1, -signal.SIGSEGV, "segfault in step 10\n")
    killed = role(made, "worker", 0, -signal.SIGKILL)
    made._watch_roles()
    die(crashed, -signal.SIGSEGV, "segfault in step 99\n")
    die(killed, -signal.SIGKILL, "")
    made._watch_roles()
    assert hosts.restarted == [("worker", 1), ("worker", 0), ("worker", 1), ("worker", 0)]


def test_a_killed_coordinator_is_named_with_its_signal_and_how_to_go_on(tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    made.children[0].process.returncode = -signal.SIGKILL  # type: ignore[misc]
    status, reason = made._unrecorded_end()
    assert status is RunStatus.FAILED
    assert reason == ("the coordinator was killed by SIGKILL; it saved no checkpoint to resume "
                      "from (launch with --checkpoint-every SECONDS to have them); see its log")
    checkpoint_folder(made.logs, 3).mkdir(parents=True)
    assert made._unrecorded_end()[1] == (f"the coordinator was killed by SIGKILL; continue it "
                                         f"from its last checkpoint with psctl resume "
                                         f"{made.run_id[:8]}")


def test_a_note_keeps_what_happened_and_the_end_of_a_long_last_line(tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    role(made, "evaluator", 0, 2, "x" * 5000 + "y")
    made._watch_roles()
    assert told(made, "evaluator", 0) == "exited with code 2: " + "x" * 599 + "y"


def test_roles_that_lost_a_killed_coordinator_are_not_named_as_failed(tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    role(made, "worker", 0, 1, "psctl worker 0: the coordinator went away\n")
    role(made, "server", 0, 1)
    made.children[0].process.returncode = -signal.SIGKILL  # type: ignore[misc]
    assert made._result().failed_children == ()
    made.children[0].process.returncode = 1  # type: ignore[misc]
    assert made._result().failed_children == ("worker 0", "server 0")


# -- what the coordinator tells the launcher ----------------------------------------------------


def link(made: Launcher) -> StandLink:
    return made._link  # type: ignore[return-value]


def test_a_wave_is_joined_once_the_coordinator_says_so_not_after_the_wait(
        tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    for rank in range(3):
        role(made, "worker", rank, None)
    link(made).inbox += [Joined(count=2), Joined(count=1), Joined(count=3)]
    began = time.monotonic()
    assert made._await_joined(3)
    assert time.monotonic() - began < 1  # WAVE_JOIN_WAIT_S is 10 s
    assert made._joined == 3  # a late, smaller count does not go back


def test_a_role_that_died_before_it_joined_does_not_hold_the_wave(tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    role(made, "worker", 0, None)
    role(made, "worker", 1, 1)  # exited before it could join
    link(made).inbox.append(Joined(count=1))
    assert made._await_joined(2)
    assert link(made).waited and max(link(made).waited) <= 0.1


def test_the_ranks_psctl_scale_added_are_started_once(tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    made._address = "ws://127.0.0.1:1"
    role(made, "worker", 0, None)
    role(made, "server", 0, None)
    link(made).inbox.append(StartRoles(workers=[0, 1, 2], servers=[0, 1]))
    made._hear(0.0)
    made._spawn_newcomers()
    made._spawn_newcomers()
    assert hosts.started == [("worker", 1), ("worker", 2), ("server", 1)]


def test_the_end_the_coordinator_told_and_recorded_is_the_result(tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    made.children[0].process.returncode = 1  # type: ignore[misc]
    link(made).inbox += [RunEnded(status="failed", reason="worker 1 failed: boom",
                                  recorded=True), Lost("closed")]
    made._await_last_word()
    result = made._result()  # no database exists: it was not read
    assert (result.status, result.reason) == (RunStatus.FAILED, "worker 1 failed: boom")
    assert made._link is None and not made.db.exists()


def test_an_end_the_database_does_not_hold_is_recorded_by_the_launcher(
        tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    made.children[0].process.returncode = 1  # type: ignore[misc]
    link(made).inbox += [RunEnded(status="failed", reason="its end could not be recorded",
                                  recorded=False), Lost("closed")]
    made._await_last_word()
    result = made._result()  # falls back to what it can tell and the database
    assert result.status is RunStatus.FAILED
    assert result.reason is not None and "could not record the run's end" in result.reason
