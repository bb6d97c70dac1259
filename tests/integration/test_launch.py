"""Real runs: coordinator, shard servers, evaluator and workers as processes on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.db.queries import run_detail
from engine.db.schema import open_engine
from engine.launcher import Launcher
from engine.proctime import usable_cores
from engine.wire.records import RunStatus
from tests.integration.support import config, processes_with, query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _run(tmp_path: Path, **overrides: object) -> tuple[Launcher, object]:
    launcher = Launcher(config(**overrides), db=tmp_path / "experiments.db")
    launcher.start()
    result = launcher.wait()
    return launcher, result


def test_bsp_two_servers_two_workers_learn_mnist_subset_and_record_everything(
        tmp_path: Path, mnist_dir: Path) -> None:
    launcher, result = _run(tmp_path, data__dataset="mnist", data__data_dir=str(mnist_dir),
                            data__train_limit=4000, cluster__workers=2, cluster__servers=2,
                            train__epochs=2, sync__model="bsp", eval__interval_s=2.0)
    db = launcher.db
    assert result.status is RunStatus.FINISHED, result.reason  # type: ignore[attr-defined]
    # 4000 samples / 2 workers = 2000 each; batch 64 -> 32 iterations per epoch.
    rows = query(db, "SELECT worker, count(*), min(iteration), max(iteration) FROM iterations "
                     "WHERE run_id = ? GROUP BY worker", launcher.run_id)
    assert rows == [(0, 64, 0, 63), (1, 64, 0, 63)]
    worst = query(db, "SELECT max(abs(compute_s + push_s + pull_s + wait_s - "
                      "(ended_at - started_at)) / (ended_at - started_at)) FROM iterations")[0][0]
    assert worst < 0.05
    assert query(db, "SELECT max(staleness) FROM iterations")[0][0] == 0
    assert query(db, "SELECT min(samples), sum(samples) FROM iterations")[0] == (16, 4000 * 2)
    evaluations = query(db, "SELECT accuracy, epoch FROM evaluations ORDER BY at")
    assert len(evaluations) >= 2
    # How well BSP learns MNIST, and how fast, is bench/end_to_end.py's and bench/faults.py's
    # clean BSP baseline (the bound here was 0.8); here: evaluations follow the epochs.
    epochs = [epoch for _, epoch in evaluations]
    assert epochs == sorted(epochs) and all(0 <= accuracy <= 1 for accuracy, _ in evaluations)
    stored = json.loads(query(db, "SELECT config_json FROM runs")[0][0])
    assert stored["cluster"]["workers"] == 2 and stored["data"]["train_limit"] == 4000
    sampled = query(db, "SELECT role, count(DISTINCT rank), min(cpu_percent), min(rss_bytes) "
                        "FROM process_samples GROUP BY role ORDER BY role")
    assert [(role, ranks) for role, ranks, _, _ in sampled] == [
        ("coordinator", 1), ("evaluator", 1), ("server", 2), ("worker", 2)]
    assert all(cpu >= 0 and rss > 2**20 for _, _, cpu, rss in sampled)
    # PSS, read in turn within the sampler's CPU budget: a few processes per sample, at least
    # one (a run of seconds may end before each had its turn). Summed at the peak, they hold
    # less than their RSS sums to: the pages they share are counted once.
    per_sample = query(db, "SELECT at, count(pss_bytes) FROM process_samples GROUP BY at")
    assert per_sample and all(read >= 1 for _, read in per_sample)
    engine = open_engine(db, readonly=True)
    try:
        peak = run_detail(engine, launcher.run_id).memory
    finally:
        engine.dispose()
    assert peak is not None and 0 < peak.peak_pss_bytes < peak.rss_bytes
    crowded = query(db, "SELECT count(*) FROM events WHERE kind = 'oversubscribed'")[0][0]
    assert crowded == (1 if usable_cores() < 5 else 0)  # 2 workers, 2 servers, the evaluator
    assert processes_with(launcher.join_token) == []


def test_asp_with_four_workers_shows_staleness(tmp_path: Path, mnist_dir: Path) -> None:
    launcher, result = _run(tmp_path, data__dataset="mnist", data__data_dir=str(mnist_dir),
                            data__train_limit=4000, cluster__workers=4, cluster__servers=1,
                            train__epochs=1, sync__model="asp", optimizer__lr=0.05)
    assert result.status is RunStatus.FINISHED  # type: ignore[attr-defined]
    stale = query(launcher.db, "SELECT max(staleness), avg(staleness) FROM iterations")[0]
    assert stale[0] > 0 and stale[1] > 0


def test_a_killed_worker_without_restarts_fails_the_run_with_its_name_and_leaves_no_process(
        tmp_path: Path) -> None:
    import os
    import signal
    import threading

    launcher = Launcher(config(data__dataset="digits", cluster__workers=2, cluster__servers=1,
                               train__epochs=200, sync__model="bsp", fault__max_restarts=0),
                        db=tmp_path / "experiments.db")
    launcher.start()

    def kill_worker_once_training() -> None:
        from tests.integration.support import wait_for

        wait_for(lambda: query(launcher.db, "SELECT count(*) FROM iterations")[0][0] > 20,
                 60, "iterations")
        worker = next(c for c in launcher.children if c.role == "worker" and c.rank == 1)
        os.kill(worker.process.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_worker_once_training)
    killer.start()
    result = launcher.wait()
    killer.join()
    assert result.status is RunStatus.FAILED
    assert result.reason is not None and "worker 1" in result.reason
    assert all(child.process.returncode is not None for child in launcher.children)
    assert processes_with(launcher.join_token) == []
