"""docs/fault-tolerance.md's commands run as written, in an empty folder, and do what the
document says: the first block's five runs finish with the events it names; the second block's
resume and scale lines run against a crashed run and a running job, the third's against a job
with 4 key ranges (RUN is their id)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DOC = (REPO / "docs" / "fault-tolerance.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)


def _lines(block: str) -> list[list[str]]:
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _psctl(words: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert words[0] == "psctl", words
    extra = ["--no-live"] if words[1] in ("launch", "resume") else []
    return subprocess.run([sys.executable, "-m", "psctl", *words[1:], *extra], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def _query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def _kinds(db: Path, name: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for kind, detail in _query(db, "SELECT kind, detail FROM events WHERE run_id = (SELECT id "
                                   "FROM runs WHERE name = ?) ORDER BY at", name):
        found.setdefault(kind, []).append(json.loads(detail))
    return found


def _every_clock_done(db: Path, name: str, restarted_at: dict[int, int] | None = None) -> None:
    """Each worker of the run did each of its planned clocks, whatever was killed on the way:
    the exact part of "the run ends as if undisturbed". A restarted worker's rows count from
    the clock it went on from (rows it had not reported when killed are lost with it). How
    close accuracy and time come to a clean run's is bench/faults.py's (reported, not failed)."""
    [(run_id, config)] = _query(db, "SELECT id, config_json FROM runs WHERE name = ?", name)
    workers = json.loads(config)["cluster"]["workers"]
    [(detail,)] = _query(db, "SELECT detail FROM events WHERE run_id = ? AND kind = "
                             "'training_started'", run_id)
    per_worker = json.loads(detail)["total_iterations"] // workers
    for worker in range(workers):
        since = (restarted_at or {}).get(worker, 0)
        assert _query(db, "SELECT count(DISTINCT iteration), max(iteration) FROM iterations "
                          "WHERE run_id = ? AND worker = ? AND iteration >= ?",
                      run_id, worker, since) == [(per_worker - since, per_worker - 1)], (
            name, worker)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1",
            "COLUMNS": "200"}


def test_the_four_documented_runs_finish_with_the_events_the_document_names(
        tmp_path: Path) -> None:
    env, db = _env(tmp_path), tmp_path / "experiments.db"
    for words in _lines(BLOCKS[0]):
        done = _psctl(words, env, tmp_path)
        assert done.returncode == 0, f"{words}\n{done.stderr}"
    statuses = dict(_query(db, "SELECT name, status FROM runs"))
    assert statuses == {name: "finished" for name in ("restarted", "failover", "rereplicated",
                                                       "lossy", "saved")}
    # These runs are also the suite's only real-process checks of a restarted worker, a
    # failed-over primary, re-replication and lossy ASP links (tests/integration/
    # test_fault_tolerance.py has BSP's lossy links and the hung primary).
    restarted = _kinds(db, "restarted")
    assert [e["spec"] for e in restarted["fault_injected"]] == ["kill:worker:1@2s"]
    assert [e["rank"] for e in restarted["worker_lost"]] == [1]
    assert [e["rank"] for e in restarted["worker_rejoined"]] == [1]
    first = [e for e in restarted["worker_ready"] if e["rank"] == 1][-1]["first_iteration"]
    assert isinstance(first, int) and first > 0  # it went on from its clock, not from 0
    _every_clock_done(db, "restarted", {1: first})
    failover = _kinds(db, "failover")
    assert [e["rank"] for e in failover["server_lost"]] == [0]
    assert [(e["index"], e["lost"], e["primary"]) for e in failover["failover"]] == [(0, 0, 1)]
    # How fast the backup took over is bench/faults.py's (failover_s), not a bound here.
    assert len(failover["failover_complete"]) == 1
    assert failover["failover_complete"][0]["seconds"] > 0
    _every_clock_done(db, "failover")  # the backup served the lost keys to the end
    lossy = _kinds(db, "lossy")
    assert sum(e["dropped"] for e in lossy["link_faults"]) > 0
    assert sum(e["resent"] for e in lossy["link_faults"]) > 0
    assert {e["spec"] for e in lossy["fault_injected"]} == {"drop:1%", "delay:5ms"}
    _every_clock_done(db, "lossy")  # how well lossy ASP learns: bench/faults.py
    assert len(_kinds(db, "saved")["checkpoint"]) >= 1
    shown = _psctl(["psctl", "runs", "show", "failover"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    for kind in ("server_lost", "failover", "failover_complete"):
        assert kind in shown.stdout
    rereplicated = _kinds(db, "rereplicated")
    assert [e["rank"] for e in rereplicated["server_lost"]] == [0, 1]
    assert [e["rank"] for e in rereplicated["server_rejoined"]] == [0, 1]
    assert [(e["index"], e["lost"], e["primary"]) for e in rereplicated["failover"]] == [
        (0, 0, 1), (1, 1, 0)]
    handed = [(e["index"], e["rank"]) for e in rereplicated["rereplicated"]]
    assert sorted(handed[:2]) == [(0, 0), (1, 0)]  # server 0 took both ranges back ...
    assert sorted(handed[2:]) == [(0, 1), (1, 1)]  # ... and so did server 1 after its death
    # each serves its own range again; how long each hand-over held is bench/moves.py's
    assert [(e["index"], e["rank"]) for e in rereplicated["primary_moved"]] == [(0, 0), (1, 1)]
    _every_clock_done(db, "rereplicated")
    shown = _psctl(["psctl", "runs", "show", "rereplicated"], env, tmp_path)
    for kind in ("server_rejoined", "rereplicated", "primary_moved"):
        assert kind in shown.stdout


def _start(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "psctl", "launch", "--dataset", "digits",
                             "--workers", "2", "--no-live", *args], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _await(predicate: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except sqlite3.Error:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_resume_and_scale_lines_run_against_a_crashed_run_and_a_running_job(
        tmp_path: Path) -> None:
    env, db = _env(tmp_path), tmp_path / "experiments.db"
    resume, grow, shrink = _lines(BLOCKS[1])
    crashing = _start(env, tmp_path, "--epochs", "15", "--sync", "asp", "--checkpoint-every",
                      "1", "--name", "crashed")
    try:
        _await(lambda: db.exists() and _query(db, "SELECT count(*) FROM events WHERE kind = "
                                                  "'checkpoint'")[0][0] >= 1, "a checkpoint")
        crashing.send_signal(signal.SIGKILL)
        crashing.wait(10)
    finally:
        if crashing.poll() is None:
            crashing.kill()
    run_id = _query(db, "SELECT id FROM runs WHERE name = 'crashed'")[0][0]
    time.sleep(1.0)  # its roles die with the launcher
    done = _psctl([word.replace("RUN", run_id[:8]) for word in resume], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert _query(db, "SELECT status FROM runs WHERE id = ?", run_id)[0][0] == "finished"
    # one clock across the crash: evaluation times and epochs never go back
    points = _query(db, "SELECT elapsed_s, epoch FROM evaluations WHERE run_id = ? ORDER BY at",
                    run_id)
    assert [e for e, _ in points] == sorted(e for e, _ in points)
    assert [p for _, p in points] == sorted(p for _, p in points)
    [(down,)] = _query(db, "SELECT json_extract(detail, '$.downtime_s') FROM events WHERE "
                           "run_id = ? AND kind = 'resumed'", run_id)
    assert down >= 1.0  # it was down at least the second slept above
    # Its rates leave the downtime out: training time is the rows' span less the down span.
    shown = json.loads(_psctl(["psctl", "runs", "show", run_id[:8], "--json"], env,
                              tmp_path).stdout)
    [span] = shown["downtime"]
    [(first, last)] = _query(db, "SELECT min(started_at), max(ended_at) FROM iterations "
                                 "WHERE run_id = ?", run_id)
    assert span["seconds"] >= 1.0
    assert shown["totals"]["wall_s"] == pytest.approx(last - first - span["seconds"])

    # Long enough to still run when the second line arrives (each command takes seconds to
    # start on a busy machine, and the roles forked from the template start at once); no
    # server momentum, which with four workers' stale pushes early in training can diverge
    # (tests/integration/test_fault_tolerance.py's SSP job did).
    job = _start(env, tmp_path, "--epochs", "120", "--sync", "asp", "--momentum", "0",
                 "--name", "scaled")
    try:
        _await(lambda: _query(db, "SELECT count(*) FROM runs WHERE name = 'scaled' AND "
                                  "iteration_count > 20")[0][0], "the job to train")
        job_id = _query(db, "SELECT id FROM runs WHERE name = 'scaled'")[0][0]
        for line, says in ((grow, "workers 2, 3 join"), (shrink, "workers 3 leave")):
            done = _psctl([word.replace("RUN", job_id[:8]) for word in line], env, tmp_path)
            assert done.returncode == 0 and says in done.stderr, done.stderr
            time.sleep(2.0)
        _, errors = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, errors
    changes = [json.loads(d)["workers"] for (d,) in _query(
        db, "SELECT detail FROM events WHERE kind = 'membership' ORDER BY at")]
    assert changes == [4, 3]


def test_the_server_scale_lines_run_against_a_job_with_four_key_ranges(tmp_path: Path) -> None:
    env, db = _env(tmp_path), tmp_path / "experiments.db"
    grow, shrink = _lines(BLOCKS[2])
    job = _start(env, tmp_path, "--epochs", "60", "--sync", "asp", "--key-ranges", "4",
                 "--name", "spread")
    try:
        _await(lambda: _query(db, "SELECT count(*) FROM runs WHERE name = 'spread' AND "
                                  "iteration_count > 20")[0][0], "the job to train")
        job_id = _query(db, "SELECT id FROM runs WHERE name = 'spread'")[0][0]
        for line, says, done_when in (
                (grow, "servers 2, 3 join", "SELECT count(*) >= 2 FROM events WHERE kind = "
                                            "'primary_moved'"),
                (shrink, "servers 3 leave", "SELECT count(*) FROM events WHERE kind = "
                                            "'server_left'")):
            done = _psctl([word.replace("RUN", job_id[:8]) for word in line], env, tmp_path)
            assert done.returncode == 0 and says in done.stderr, done.stderr
            _await(lambda sql=done_when: _query(db, sql)[0][0], says)
        _, errors = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, errors
    changes = [json.loads(d)["servers"] for (d,) in _query(
        db, "SELECT detail FROM events WHERE kind = 'server_membership' ORDER BY at")]
    assert changes == [4, 3]
