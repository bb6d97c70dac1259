"""``stop_run`` against stand-in processes: it ends a run's own processes and never another."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.db.schema import open_engine
from engine.hosts import MIN_WAVE, fresh_wave
from engine.stopping import run_processes, stop_run

pytestmark = pytest.mark.timeout(60)
ADDRESS = "ws://127.0.0.1:1"
# Stand-ins for role processes: a command line like theirs, without starting torch.
SLEEPER = "import signal, sys, time\nif 'stubborn' in sys.argv: signal.signal(signal.SIGTERM, " \
          "signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"


class Processes:
    """Starts stand-ins and, whatever happens, kills (only) those it started."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *argv: str) -> subprocess.Popen[str]:
        process = subprocess.Popen([sys.executable, "-c", SLEEPER, *argv],
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "up\n"
        self.started.append(process)
        return process

    def coordinator(self, run_id: str, *extra: str) -> subprocess.Popen[str]:
        return self.start("engine.roles", "coordinator", "--run-id", run_id, *extra)

    def role(self, role: str, rank: int, address: str = ADDRESS) -> subprocess.Popen[str]:
        return self.start("engine.roles", role, "--coordinator", address, "--rank", str(rank))


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    for process in started.started:
        process.kill()
        process.wait(5)


def record_run(db: Path, run_id: str, coordinator: int, joined: dict[tuple[str, int], int],
               *, started_at: float | None = None) -> None:
    """A live run's row and the events its coordinator writes: its own pid, then each role's."""
    open_engine(db).dispose()  # creates the tables
    at = time.time() if started_at is None else started_at
    rows = [("coordinator_listening", {"address": ADDRESS, "pid": coordinator})]
    rows += [("process_joined", {"role": role, "rank": rank, "pid": pid})
             for (role, rank), pid in joined.items()]
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, config_json, "
                     "sync, workers, servers, dataset) VALUES (?, 'r', 'running', ?, ?, '{}', "
                     "'bsp', 2, 1, 'digits')", (run_id, at, at))
        conn.executemany("INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                         [(run_id, at, kind, json.dumps(d)) for kind, d in rows])
    conn.close()


def test_stop_run_ends_the_coordinator_and_its_roles(tmp_path: Path,
                                                     processes: Processes) -> None:
    db = tmp_path / "experiments.db"
    run_id = uuid.uuid4().hex
    coordinator = processes.coordinator(run_id)
    worker = processes.role("worker", 0)
    record_run(db, run_id, coordinator.pid, {("worker", 0): worker.pid})
    began = time.monotonic()
    stopped = stop_run(db, run_id, grace_s=1)
    assert sorted(p.label for p in stopped) == ["coordinator", "worker 0"]
    # The coordinator is asked to wind the run down; a role still there after the grace (a real
    # coordinator would have dismissed it) is killed.
    assert coordinator.wait(1) == -signal.SIGTERM
    assert worker.wait(1) == -signal.SIGKILL
    assert time.monotonic() - began < 4


def test_what_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path,
                                                        processes: Processes) -> None:
    db = tmp_path / "experiments.db"
    run_id = uuid.uuid4().hex
    coordinator = processes.coordinator(run_id, "stubborn")
    record_run(db, run_id, coordinator.pid, {})
    began = time.monotonic()
    assert [p.label for p in stop_run(db, run_id, grace_s=0.5)] == ["coordinator"]
    assert coordinator.wait(2) == -signal.SIGKILL
    assert time.monotonic() - began < 3


def test_pids_that_are_not_the_runs_processes_are_never_signalled(
        tmp_path: Path, processes: Processes) -> None:
    db = tmp_path / "experiments.db"
    run_id = uuid.uuid4().hex
    other_run = processes.coordinator(uuid.uuid4().hex)  # another run's coordinator
    elsewhere = processes.role("worker", 0, address="ws://127.0.0.1:2")  # another run's worker
    wrong_rank = processes.role("worker", 5)
    plain = processes.start("not", "a", "role")
    record_run(db, run_id, other_run.pid, {
        ("worker", 0): elsewhere.pid, ("worker", 1): wrong_rank.pid, ("server", 0): plain.pid,
        ("evaluator", 0): 1})
    assert run_processes(db, run_id) == []
    assert stop_run(db, run_id, grace_s=0.5) == []
    assert all(p.poll() is None for p in (other_run, elsewhere, wrong_rank, plain))


def test_a_process_older_than_the_run_is_not_its_role(tmp_path: Path,
                                                      processes: Processes) -> None:
    db = tmp_path / "experiments.db"
    run_id = uuid.uuid4().hex
    coordinator = processes.coordinator(run_id)
    worker = processes.role("worker", 0)  # its command line, but it started before the run
    record_run(db, run_id, coordinator.pid, {("worker", 0): worker.pid},
               started_at=time.time() + 10)
    assert [p.label for p in run_processes(db, run_id)] == ["coordinator"]


TITLED = "import setproctitle, sys, time\nsetproctitle.setproctitle(' '.join(sys.argv[1:]))\n" \
         "print('up', flush=True)\ntime.sleep(60)"


def test_a_role_forked_from_the_template_is_known_by_its_title(tmp_path: Path) -> None:
    """A forked role's command line is the template's; its title (one string) is a fresh
    role's command line, and that is what proves the pid is the run's role."""
    db = tmp_path / "experiments.db"
    run_id = uuid.uuid4().hex
    titled = [subprocess.Popen([sys.executable, "-c", TITLED, sys.executable, "-m",
                                "engine.roles", "worker", "--coordinator", address, "--rank",
                                "0"], stdout=subprocess.PIPE, text=True)
              for address in (ADDRESS, "ws://127.0.0.1:2")]  # the second: another run's
    try:
        for process in titled:
            assert process.stdout is not None and process.stdout.readline() == "up\n"
        record_run(db, run_id, titled[0].pid, {("worker", 0): titled[0].pid,
                                                ("worker", 1): titled[1].pid})
        assert [p.label for p in run_processes(db, run_id)] == ["worker 0"]
    finally:
        for process in titled:
            process.kill()
            process.wait(5)


def test_roles_start_in_waves_of_a_few_per_core() -> None:
    assert fresh_wave() >= MIN_WAVE


def test_the_start_up_report_counts_from_the_command_and_says_the_templates_part() -> None:
    from engine.launcher import StartUpClock

    clock = StartUpClock(origin=1000.0)
    clock.moments = {"launcher": 1000.5, "coordinator": 1000.9, "joined": 1002.0}
    told = clock.report({"mode": "template", "note": None,
                         "at": {"template_stage_1": 1001.7, "template": 999.0},
                         "took": {"template_stage_1_s": 0.9, "data_s": 0.03}})
    assert told.mode == "template" and told.origin == 1000.0
    assert told.at == {"template_stage_1": 1.7, "template": 0.0,  # never before the command
                       "launcher": 0.5, "coordinator": 0.9, "joined": 2.0}
    assert told.took == {"template_stage_1_s": 0.9, "data_s": 0.03}
    fresh = StartUpClock(origin=None)
    fresh.mark("launcher")  # without the command's start, counted from the launcher's
    assert fresh.report({"mode": "fresh", "note": "x" * 5000}).at == {"launcher": 0.0}
    assert len(fresh.report({"mode": "fresh", "note": "x" * 5000}).note or "") == 1000
