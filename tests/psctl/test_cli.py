"""The command line, end to end: real launches in subprocesses, then the read commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from psctl.cli import app
from tests.conftest import psctl
from tests.integration.support import (
    descendants,
    launch_in_background,
    processes_with,
    query,
    running,
    wait_for,
)

runner = CliRunner()
pytestmark = pytest.mark.timeout(240)


def test_launch_records_a_finished_run(seeded_db: Path) -> None:
    assert query(seeded_db, "SELECT name, status FROM runs") == [("seed-run", "finished")]


def test_runs_ls_json_lists_the_run(seeded_db: Path) -> None:
    result = runner.invoke(app, ["runs", "ls", "--json", "--db", str(seeded_db)])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)
    assert [run["name"] for run in runs] == ["seed-run"]
    assert runs[0]["status"] == "finished" and runs[0]["best_accuracy"] > 0.5


def test_runs_show_by_selector_has_per_worker_timings(seeded_db: Path) -> None:
    result = runner.invoke(app, ["runs", "show", "@last", "--json", "--db", str(seeded_db)])
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert [w["worker"] for w in detail["workers"]] == [0, 1]
    assert all(w["staleness_max"] == 0 for w in detail["workers"])  # bsp
    assert detail["config"]["cluster"]["workers"] == 2
    table = runner.invoke(app, ["runs", "show", "seed-run", "--db", str(seeded_db)],
                          env={"COLUMNS": "200"})
    assert "wait (idle)" in table.stdout and "staleness" in table.stdout


def test_unknown_run_exits_4(seeded_db: Path) -> None:
    result = runner.invoke(app, ["runs", "show", "nope", "--db", str(seeded_db)])
    assert result.exit_code == 4
    assert "nope" in result.stderr


def test_missing_data_fails_fast_with_a_fix(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _launch_offline(tmp_path)
    assert done.returncode == 1
    assert "--data-dir" in done.stderr and "digits" in done.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "x.db").exists()


def _launch_offline(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PSCTL_DB=str(tmp_path / "x.db"), XDG_CACHE_HOME=str(tmp_path),
               NO_COLOR="1")
    env.pop("PSCTL_DATA_DIR", None)
    # An unroutable proxy keeps the download attempt offline and quick.
    env.update(http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "psctl", "launch", "--dataset", "mnist",
                           "--data-dir", str(tmp_path / "nowhere")], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_invalid_option_is_a_clear_config_error(tmp_path: Path) -> None:
    done = psctl("launch", "--workers", "0", "--dataset", "digits", db=tmp_path / "x.db")
    assert done.returncode == 2  # a bad option value: a usage error (docs/cli.md)
    assert "cluster.workers" in done.stderr


def test_ctrl_c_stops_every_process_and_marks_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    # Fresh processes, whose environments /proc shows (a role forked from the template has its
    # secret in its memory alone; tests/engine/hosts/test_template.py checks what it gets).
    launch = launch_in_background(db, "--no-template")
    wait_for(lambda: db.exists() and query(db, "SELECT count(*) FROM iterations")[0][0] > 10,
             90, "training to start")
    # The coordinator and the server hold the run's secret; the evaluator and the two workers
    # only their own credentials.
    secret_holders = [pid for pid in processes_with("PSCTL_TOKEN=")
                      if _parent_chain_has(pid, launch.pid)]
    credential_holders = [pid for pid in processes_with("PSCTL_CREDENTIAL=")
                          if _parent_chain_has(pid, launch.pid)]
    assert (len(secret_holders), len(credential_holders)) == (2, 3)
    token_holders = secret_holders + credential_holders
    interrupted = time.monotonic()
    launch.send_signal(signal.SIGINT)
    _, stderr = launch.communicate(timeout=60)  # reaps it and closes its pipes
    # A hang guard; how soon it ends (goal 5 s) is bench/run_stops.py's "ctrl-c" row.
    assert time.monotonic() - interrupted < 60.0
    assert launch.returncode == 130
    # A normal Ctrl-C is an interruption, not a failure of the processes it stopped.
    assert "interrupted: the run's 5 processes were stopped" in " ".join(stderr.split())
    assert "failed" not in stderr
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    assert [pid for pid in token_holders if Path(f"/proc/{pid}").exists()
            and "zombie" not in Path(f"/proc/{pid}/status").read_text()] == []


@pytest.mark.integration
def test_ctrl_c_twice_stops_every_process_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    launch = launch_in_background(db)
    wait_for(lambda: db.exists() and query(db, "SELECT count(*) FROM iterations")[0][0] > 10,
             90, "training to start")
    run_id = query(db, "SELECT id FROM runs")[0][0]
    # the coordinator, the template and the four roles forked from it
    started = descendants(launch.pid)
    assert len(started) == 6
    launch.send_signal(signal.SIGINT)
    time.sleep(0.3)  # while the first one stops the run
    launch.send_signal(signal.SIGINT)
    _, stderr = launch.communicate(timeout=30)
    assert launch.returncode == 130
    assert "between runs" not in stderr
    assert "interrupted" in stderr
    wait_for(lambda: not processes_with(run_id), 10, "the run's processes to end")
    wait_for(lambda: not any(map(running, started)), 10, "every process it started to end")


def _parent_chain_has(pid: int, ancestor: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == ancestor


def test_cli_and_dashboard_never_import_torch() -> None:
    # Every module of both packages, and what they import, so a new module cannot slip it in.
    code = ("import importlib, pkgutil, sys, psctl, webui, engine.launcher\n"
            "import engine.analysis.replay\n"
            "for package in (psctl, webui):\n"
            "    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
            "        if module.name != 'psctl.__main__':\n"
            "            importlib.import_module(module.name)\n"
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
