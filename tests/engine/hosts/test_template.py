"""Roles forked from the warm template: each in its own session with its own environment and
log, its exit code (or the signal that killed it) read back as ``subprocess.Popen`` gives it,
and nothing left behind when the launcher lets go. A real template process, real forks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import LaunchError
from engine.hosts import RoleEnv
from engine.hosts.template import Template, TemplateHosts, TemplateProcess

pytestmark = pytest.mark.integration  # a real process that imports torch

NO_SECRETS = {key: value for key, value in os.environ.items()
              if key not in ("PSCTL_TOKEN", "PSCTL_CREDENTIAL")}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Template]:
    made = Template(NO_SECRETS, tmp_path_factory.mktemp("template") / "template.log")
    try:
        assert made.wait_ready(120), "the template did not get warm"
        yield made
    finally:
        made.close()


def _fork(template: Template, tmp_path: Path, args: list[str],
          env: dict[str, str] | None = None, name: str = "role.log") -> TemplateProcess:
    log = tmp_path / name
    pid = template.fork(args, env if env is not None else NO_SECRETS, log, False)
    return TemplateProcess(template, pid, log, "127.0.0.1")


def test_a_forked_role_gets_the_environment_it_is_given_not_the_templates(
        template: Template, tmp_path: Path) -> None:
    """A coordinator with the secret in its environment (the template holds none) gets past
    that check and fails on its missing config file, in its own log, with exit code 1."""
    args = ["coordinator", "--config", str(tmp_path / "missing.json"), "--run-id", "r",
            "--name", "n", "--db", str(tmp_path / "runs.db")]
    role = _fork(template, tmp_path, args, NO_SECRETS | {"PSCTL_TOKEN": "the-secret"})
    assert role.wait(60) == 1
    text = role.log.read_text()
    assert "missing.json" in text and "PSCTL_TOKEN is not set" not in text

    without = _fork(template, tmp_path, args, NO_SECRETS, "without.log")
    assert without.wait(60) == 1
    assert "PSCTL_TOKEN is not set" in without.log.read_text()


def test_a_killed_role_reads_as_killed_by_that_signal_and_is_not_signalled_again(
        template: Template, tmp_path: Path) -> None:
    # A server whose coordinator is nowhere keeps trying to reach it until killed.
    role = _fork(template, tmp_path, ["server", "--coordinator", "ws://127.0.0.1:9"],
                 NO_SECRETS | {"PSCTL_TOKEN": "the-secret"})
    assert role.poll() is None
    # Its own session (set in the child, just after the fork): a terminal's Ctrl-C misses it.
    deadline = time.monotonic() + 30
    while os.getsid(role.pid) != role.pid and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.getsid(role.pid) == role.pid
    with pytest.raises(subprocess.TimeoutExpired):
        role.wait(0.2)
    role.send_signal(signal.SIGTERM)
    code = role.wait(60)
    assert code in (-signal.SIGTERM, 1)  # killed, or it caught the signal and said so
    role.kill()  # ended: never a signal to a pid that may be another process's by now
    assert role.returncode == code


def test_an_unreadable_request_is_refused_and_the_template_serves_on(
        template: Template, tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="cannot fork"):
        template.fork(["worker"], NO_SECRETS, tmp_path / "no-such-folder" / "role.log", False)
    role = _fork(template, tmp_path, ["worker", "--coordinator", "ws://127.0.0.1:9"])
    assert role.wait(60) == 1  # no credential: said in its log, as from a fresh process
    assert "PSCTL_CREDENTIAL is not set" in role.log.read_text()


def test_the_template_answers_garbage_with_an_error_line(tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "engine.roles.template"], input=b"not json\n{\"id\": 1}\n",
        capture_output=True, timeout=120, env=NO_SECRETS, check=False)
    replies = [json.loads(line) for line in process.stdout.splitlines()]
    assert process.returncode == 0  # its stdin closed: it ends
    assert replies[0]["warm"] == 0
    errors = [reply["error"] for reply in replies if "error" in reply]
    assert len(errors) == 2
    assert all(error.startswith("a request the template cannot read") for error in errors)


def test_hosts_fork_every_role_and_let_go_at_close(
        tmp_path: Path) -> None:
    hosts = TemplateHosts("127.0.0.1", RoleEnv(), tmp_path)
    hosts.open("run")
    try:
        env = RoleEnv({"PSCTL_TOKEN": "the-secret"})
        server = hosts.start("server", 0, ["server", "--coordinator", "ws://127.0.0.1:9"], env,
                             tmp_path / "server-0.log")
        assert isinstance(server, TemplateProcess)
        again = hosts.restart(server, "server", 0,
                              ["server", "--coordinator", "ws://127.0.0.1:9"], env,
                              tmp_path / "server-0.log")
        assert isinstance(again, TemplateProcess) and again.pid != server.pid
        # The coordinator is forked too (before torch), and says where it listens in a file:
        # this one only prints its help, so it says nowhere.
        announcing = hosts.start("coordinator", 0, ["coordinator", "--help"], env,
                                 tmp_path / "coordinator.log", announce=True)
        assert isinstance(announcing, TemplateProcess)
        assert hosts.announcement(announcing, 30) is None
        assert announcing.wait(60) == 0
        assert "--announce-file" in (tmp_path / "coordinator.log").read_text()
        for role in (server, again):
            role.kill()
            assert role.wait(60) == -signal.SIGKILL
    finally:
        hosts.close()
    assert (tmp_path / "template.log").exists()


def test_a_wait_on_a_role_of_a_gone_template_looks_again_shortly_not_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the template gone no reply says when a role ends: the wait polls, it does not spin."""
    from engine.hosts import template as module

    gone = object.__new__(Template)
    gone._replies = module._Replies(gone=True)  # what the reader thread leaves when it ends
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    looks = 0
    real = module._alive

    def counted(pid: int) -> bool:
        nonlocal looks
        looks += 1
        return real(pid)

    monkeypatch.setattr(module, "_alive", counted)
    try:
        role = TemplateProcess(gone, sleeper.pid, Path("/dev/null"), "127.0.0.1")
        began = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            role.wait(timeout=0.3)
        assert time.monotonic() - began >= 0.3
        assert looks <= 2 * (0.3 / module.GONE_POLL_S + 2)  # a spin makes thousands
        assert role.poll() is None  # a poll still answers at once
        sleeper.kill()
        sleeper.wait(5)
        assert role.wait(timeout=1.0) == -signal.SIGKILL  # ended: read as killed, at once
    finally:
        sleeper.kill()
        sleeper.wait(5)


def test_a_template_not_warm_in_time_leaves_the_coordinator_to_a_fresh_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.hosts import template as module
    from engine.hosts.local import LocalProcess

    monkeypatch.setattr(module, "READY_TIMEOUT_S", 0.01)  # no template is warm that soon
    hosts = TemplateHosts("127.0.0.1", RoleEnv(), tmp_path)
    hosts.open("run")
    try:
        env = RoleEnv({"PSCTL_TOKEN": "the-secret"})
        coordinator = hosts.start("coordinator", 0, ["coordinator", "--help"], env,
                                  tmp_path / "coordinator.log", announce=True)
        assert isinstance(coordinator, LocalProcess)  # a fresh Python, as without a template
        assert coordinator.wait(60) == 0
        said = hosts.start_up()
        assert said["mode"] == "fresh" and "did not start the coordinator" in said["note"]
        worker = hosts.start("worker", 0, ["worker", "--coordinator", "ws://127.0.0.1:9"],
                             RoleEnv(), tmp_path / "worker-0.log")
        assert isinstance(worker, LocalProcess)  # and so is every role after it
        assert worker.wait(60) == 1
    finally:
        hosts.close()


def test_roles_restarted_after_the_template_died_start_as_fresh_processes(
        tmp_path: Path) -> None:
    from engine.hosts.local import LocalProcess

    hosts = TemplateHosts("127.0.0.1", RoleEnv(), tmp_path)
    hosts.open("run")
    try:
        env = RoleEnv({"PSCTL_TOKEN": "the-secret"})
        args = ["server", "--coordinator", "ws://127.0.0.1:9"]
        server = hosts.start("server", 0, args, env, tmp_path / "server-0.log")
        assert isinstance(server, TemplateProcess)
        assert hosts._template is not None
        hosts._template.process.kill()  # its roles die with it (they asked to)
        assert server.wait(60) < 0
        again = hosts.restart(server, "server", 0, args, env, tmp_path / "server-0.log")
        assert isinstance(again, LocalProcess)
        assert hosts.start_up()["mode"] == "fresh"
        again.kill()
        again.wait(60)
    finally:
        hosts.close()


def test_a_role_reaped_before_its_end_is_heard_is_killed_without_an_error() -> None:
    """The template reaps a role and then tells its exit code: a kill in between (a second
    Ctrl-C stopping every role at once) found no process and raised ProcessLookupError on a
    busy machine, which ended psctl launch with a traceback and exit 1 instead of 130."""

    class Unheard:
        def exit_code(self, pid: int, timeout: float | None = None) -> int | None:
            return None  # not yet told

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(10)  # reaped: its pid names no process now
    role = TemplateProcess(Unheard(), ended.pid, Path("/dev/null"), "127.0.0.1")  # type: ignore[arg-type]
    role.kill()
    role.send_signal(signal.SIGTERM)
