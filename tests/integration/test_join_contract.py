"""The join contract's failures: a role that never arrives, a role without the run's secret.
A run whose every role is started by hand on its own loopback address trains in
tests/test_cluster_doc.py, which runs docs/cluster.md's commands."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.support import query

COORDINATOR = "127.0.0.10"


def _role(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "psctl", "role", *args],
                            env=os.environ | {"NO_COLOR": "1", "COLUMNS": "200"} | env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _coordinator(db: Path, token: str, *launch_options: str) -> tuple[subprocess.Popen[str], str]:
    coordinator = _role("coordinator", "--host", COORDINATOR, "--db", str(db), *launch_options,
                        env={"PSCTL_TOKEN": token})
    assert coordinator.stdout is not None
    line = coordinator.stdout.readline()  # the first line it prints: where it listens
    assert line.startswith(f"PSCTL_COORDINATOR ws://{COORDINATOR}:"), line
    return coordinator, line.split()[1].removeprefix("ws://")


def _finish(processes: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str]]:
    deadline, ended = time.monotonic() + timeout, []
    for process in processes:
        try:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        ended.append((process.returncode, out + err))
    return ended


def test_a_role_that_never_arrives_is_named_when_the_wait_ends(tmp_path: Path) -> None:
    db, token = tmp_path / "missing.db", secrets.token_urlsafe(32)
    coordinator, address = _coordinator(db, token, "--workers", "2", "--servers", "1",
                                        "--dataset", "digits", "--join-timeout", "12")
    contract = {"PSCTL_COORDINATOR": address, "PSCTL_TOKEN": token}
    server = _role("server", "--host", "127.0.0.11", env=contract)
    worker = _role("worker", "--rank", "1", "--host", "127.0.0.12", env=contract)
    evaluator = _role("evaluator", "--host", "127.0.0.13", env=contract)
    ended = _finish([coordinator, server, worker, evaluator], timeout=90)
    code, output = ended[0][0], " ".join(ended[0][1].split())  # as one line, however wrapped
    assert code == 1, output
    assert "1 of 4 processes (worker 0) did not join" in output, output
    assert "--join-timeout" in output
    assert all(process.returncode is not None for process in (server, worker, evaluator))
    [(status, reason)] = query(db, "SELECT status, reason FROM runs")
    assert status == "failed" and "worker 0" in reason


def test_a_role_without_the_runs_secret_is_told_how_to_get_one(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PSCTL_TOKEN", "PSCTL_CREDENTIAL")}
    done = subprocess.run([sys.executable, "-m", "psctl", "role", "worker", "--coordinator",
                           "127.0.0.1:9"], env=env | {"NO_COLOR": "1", "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "set PSCTL_TOKEN" in done.stderr and "token_urlsafe" in done.stderr
