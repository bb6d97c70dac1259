"""The Ray actor's body, without Ray: it starts a role's process, reports its exit, signals
only its own child and keeps its log."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil

from engine.hosts import NODE
from engine.hosts.ray_host import RoleHost

# A worker pointed at a port nobody listens on keeps trying to join for a minute: long enough
# to look at and to signal.
_WAITING = ["worker", "--coordinator", "ws://127.0.0.1:9", "--rank", "0", "--host", NODE]


def test_a_role_runs_with_its_node_address_and_its_exit_code_comes_back(tmp_path: Path) -> None:
    host = RoleHost()
    log = tmp_path / "node" / "bad.log"
    pid, node, _ = host.start(["no-such-role"], {"PSCTL_TOKEN": "x" * 40}, {}, str(log),
                              node="127.0.0.9")
    assert node == "127.0.0.9"
    assert host.wait_exit(pid, timeout=60) == 2  # argparse refuses the role
    assert "invalid choice" in host.log_tail()


def _command_once_exec(pid: int, limit_s: float = 30.0) -> list[str]:
    """The child's command line once it has replaced the forked copy of this process (on a
    loaded machine the fork's own command line, pytest's, shows for a while)."""
    deadline = time.monotonic() + limit_s
    while True:
        command = psutil.Process(pid).cmdline()
        if "engine.roles" in command or time.monotonic() > deadline:
            return command
        time.sleep(0.02)


def test_signals_reach_its_own_child_and_a_kill_shows_in_the_exit(tmp_path: Path) -> None:
    host = RoleHost()
    pid, _, _ = host.start(_WAITING, {"PSCTL_CREDENTIAL": "x" * 40}, {}, str(tmp_path / "w.log"),
                           node="127.0.0.9")
    try:
        command = _command_once_exec(pid)
        assert command[command.index("--host") + 1] == "127.0.0.9"
        assert host.wait_exit(pid, timeout=0.2) is None  # still trying to join
        host.signal(pid, signal.SIGKILL)
        assert host.wait_exit(pid, timeout=30) == -signal.SIGKILL
        host.signal(pid, signal.SIGKILL)  # gone: a no-op, never another process
        host.signal(12345678, signal.SIGKILL)  # not its child: ignored
    finally:
        if host.wait_exit(pid, timeout=0) is None:
            host.signal(pid, signal.SIGKILL)


def test_a_restart_logs_on_in_the_same_file(tmp_path: Path) -> None:
    host, log = RoleHost(), tmp_path / "r.log"
    first, _, _ = host.start(["no-such-role"], {}, {}, str(log), node="127.0.0.9")
    host.wait_exit(first, timeout=60)
    size = log.stat().st_size
    second, _, _ = host.start(["no-such-role"], {}, {}, str(log), append=True, node="127.0.0.9")
    host.wait_exit(second, timeout=60)
    assert log.stat().st_size > size
    started = time.monotonic()
    assert host.wait_exit(second, timeout=5) == 2 and time.monotonic() - started < 5
