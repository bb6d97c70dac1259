"""How the launcher treats a role that ended, and what it says of a coordinator that died, with
stand-in processes (nothing is started): restarts for kills, a note for the coordinator for an
error or a crash that repeats itself."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.launcher import Child, Launcher
from engine.plan import build_config
from engine.roles.checkpoints import checkpoint_folder
from engine.roles.exits import exit_note_path, read_exit_note
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

    def restart(self, process: Stand, role: str, rank: int, args: list[str], env: object,
                log: Path) -> Stand:
        self.restarted.append((role, rank))
        return Stand(log)


def launcher(tmp_path: Path, **values: object) -> tuple[Launcher, StandHosts]:
    hosts = StandHosts()
    run = build_config({}, {"data.dataset": "digits", **values})
    made = Launcher(run, db=tmp_path / "runs.db", hosts=hosts)  # type: ignore[arg-type]
    made.logs.mkdir(parents=True)
    made.children.append(Child("coordinator", 0, Stand(made.logs / "coordinator.log"),
                               made.logs / "coordinator.log"))
    return made, hosts


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
    note = read_exit_note(made.logs, "worker", 1, since=0.0)
    assert note == "exited with code 1: loading | Traceback ... | ValueError: NaN in features"


def test_killed_workers_and_the_evaluator_are_restarted_and_nothing_is_noted(
        tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    role(made, "worker", 0, -signal.SIGKILL)
    role(made, "evaluator", 0, -signal.SIGKILL)
    role(made, "worker", 1, 0)  # done
    role(made, "server", 0, -signal.SIGKILL)  # without replicas a server is not restarted
    made._watch_roles()
    assert hosts.restarted == [("worker", 0), ("evaluator", 0)]
    assert not exit_note_path(made.logs, "worker", 1).exists()
    assert read_exit_note(made.logs, "server", 0, since=0.0) == (
        f"was killed by SIGKILL and was not restarted: nothing in {made.logs}/server-0.log")
    assert "killed by SIGKILL (-9); restarting it" in (made.logs / "worker-0.log").read_text()


def test_a_crash_that_repeats_itself_after_a_restart_is_not_restarted_again(
        tmp_path: Path) -> None:
    made, hosts = launcher(tmp_path)
    child = role(made, "worker", 1, -signal.SIGSEGV, "Fatal Python error: Segmentation fault\n")
    made._watch_roles()
    assert hosts.restarted == [("worker", 1)]
    die(child, -signal.SIGSEGV, "Fatal Python error: Segmentation fault\n")
    made._watch_roles()
    assert hosts.restarted == [("worker", 1)]
    note = read_exit_note(made.logs, "worker", 1, since=0.0)
    assert note == ("was killed by SIGSEGV again after a restart, with the same last words, so "
                    "it is not restarted again: Fatal Python error: Segmentation fault")


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
    stored = json.loads(exit_note_path(made.logs, "evaluator", 0).read_text())
    assert stored == {"why": "exited with code 2: " + "x" * 599 + "y"}


def test_roles_that_lost_a_killed_coordinator_are_not_named_as_failed(tmp_path: Path) -> None:
    made, _ = launcher(tmp_path)
    role(made, "worker", 0, 1, "psctl worker 0: the coordinator went away\n")
    role(made, "server", 0, 1)
    made.children[0].process.returncode = -signal.SIGKILL  # type: ignore[misc]
    assert made._result().failed_children == ()
    made.children[0].process.returncode = 1  # type: ignore[misc]
    assert made._result().failed_children == ("worker 0", "server 0")
