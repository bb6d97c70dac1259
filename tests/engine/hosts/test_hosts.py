"""The launcher backend interface's shared parts: a role's environment, its address, and
reading the coordinator's announcement."""

from __future__ import annotations

import subprocess
import sys

from engine.hosts import NODE, RoleEnv, read_announcement, with_node


def test_a_role_gets_its_own_secret_never_the_hosts() -> None:
    host = {"PATH": "/bin", "PSCTL_TOKEN": "host-secret", "PSCTL_CREDENTIAL": "other",
            "OMP_NUM_THREADS": "8"}
    env = RoleEnv({"PSCTL_CREDENTIAL": "mine"}, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    got = env.over(host)
    assert got["PSCTL_CREDENTIAL"] == "mine"
    assert "PSCTL_TOKEN" not in got
    assert got["PATH"] == "/bin"
    # a default yields to what the host set; one the host left alone applies
    assert got["OMP_NUM_THREADS"] == "8" and got["MKL_NUM_THREADS"] == "1"


def test_the_node_placeholder_becomes_the_address_where_the_role_runs() -> None:
    args = ["server", "--host", NODE, "--rank", "1"]
    assert with_node(args, "127.0.0.3") == ["server", "--host", "127.0.0.3", "--rank", "1"]


def _printing(text: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import sys, time; sys.stdout.write({text!r});"
                             "sys.stdout.flush(); time.sleep(5)"], stdout=subprocess.PIPE)


def test_the_announcement_is_the_address_on_the_first_line() -> None:
    process = _printing("PSCTL_COORDINATOR ws://127.0.0.4:7777\n")
    try:
        assert read_announcement(process, 10) == "ws://127.0.0.4:7777"
    finally:
        process.kill()
        process.wait()


def test_anything_else_or_silence_is_no_announcement() -> None:
    for text in ("Traceback (most recent call last)\n", "PSCTL_COORDINATOR ws://x"):
        process = _printing(text)
        try:
            assert read_announcement(process, 1.0) is None
        finally:
            process.kill()
            process.wait()
