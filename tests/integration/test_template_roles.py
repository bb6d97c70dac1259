"""Roles forked from the warm template (issue 43), through ``psctl launch`` and real processes:
each draws its own random numbers and batches, shares the data set's pages with the others (its
proportional memory well below its resident memory), the coordinator is forked before torch is
imported, and the run records where its start-up went, which ``psctl runs show`` says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import psctl
from tests.integration.support import query, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROBE = '''
import math
import random

import numpy as np
from torch import nn

import psctl


class Probe(nn.Module):
    def __init__(self, inputs, classes):
        super().__init__()
        self.out = nn.Linear(inputs, classes)

    def forward(self, x):
        psctl.log("py_random", random.random())
        psctl.log("np_random", float(np.random.random()))
        psctl.log("batch_sum", float(x.sum()))
        return self.out(x.flatten(1))


def build(input_shape, num_classes):
    return Probe(math.prod(input_shape), num_classes)
'''


def _details(db: Path, kind: str) -> list[dict[str, object]]:
    return [json.loads(d) for (d,) in query(db, "SELECT detail FROM events WHERE kind = ? "
                                                "ORDER BY at", kind)]


def _metric(db: Path, name: str, worker: int) -> list[float]:
    return [v for (v,) in query(db, "SELECT value FROM user_metrics WHERE name = ? AND role = "
                                    "'worker' AND rank = ? ORDER BY iteration", name, worker)]


def test_forked_workers_draw_their_own_random_numbers_and_batches(tmp_path: Path) -> None:
    model = tmp_path / "probe.py"
    model.write_text(PROBE)
    db = tmp_path / "runs.db"
    done = psctl("launch", "--dataset", "digits", "--model", f"{model}:build", "--workers", "2",
                 "--servers", "1", "--epochs", "1", "--no-live", db=db)
    assert done.returncode == 0, done.stdout + done.stderr
    joins = _details(db, "process_joined")
    assert len(joins) == 4 and all(j["forked"] is True for j in joins)
    # Python's and numpy's generators: the template's state, reseeded in each fork (without
    # that, both workers drew the same numbers).
    for name in ("py_random", "np_random"):
        zero, one = _metric(db, name, 0), _metric(db, name, 1)
        assert zero and one and zero[0] != one[0], name
        assert len(set(zero) | set(one)) == len(zero) + len(one), name
    assert _metric(db, "batch_sum", 0) != _metric(db, "batch_sum", 1)

    [start] = _details(db, "start_up")
    at = start["at"]
    assert start["mode"] == "template" and isinstance(at, dict)
    # The coordinator was forked too, once the template had its modules (before torch).
    [listening] = _details(db, "coordinator_listening")
    assert listening["forked"] is True
    assert at["template_stage_0"] <= at["coordinator"]
    assert at["launcher"] <= at["roles_started"] <= at["joined"]
    shown = " ".join(psctl("runs", "show", "@last", db=db).stdout.split())  # unwrapped
    assert "roles forked from the warm template" in shown
    assert "4 of 4 forked" in shown


def test_a_forked_role_shares_the_data_sets_pages(tmp_path: Path, mnist_dir: Path) -> None:
    """MNIST's 60,000 training images are 188 MB of float32, loaded once by the template: a
    worker maps every page of them (its RSS counts them all) but holds only its share (its
    PSS counts each page over the processes that share it)."""
    db = tmp_path / "runs.db"
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    launch = subprocess.Popen(
        [sys.executable, "-m", "psctl", "launch", "--dataset", "mnist", "--data-dir",
         str(mnist_dir), "--workers", "2", "--servers", "1", "--max-seconds", "60", "--no-live"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: query(db, "SELECT count(*) FROM iterations")[0][0] > 4, 120,
                 "training")
        data_bytes = 60_000 * 784 * 4
        for join in _details(db, "process_joined"):
            if join["role"] != "worker":
                continue
            memory = psutil.Process(int(str(join["pid"]))).memory_full_info()
            assert memory.rss > data_bytes, memory
            assert memory.rss - memory.pss > data_bytes / 2, memory
    finally:
        launch.send_signal(signal.SIGINT)
        launch.communicate(timeout=60)
    assert launch.returncode in (0, 130)


def test_an_early_template_no_run_took_is_ended_and_leaves_nothing(tmp_path: Path) -> None:
    """``psctl launch`` starts the template before it has read the run's settings; a run that
    is refused, or that turns out not to want one (a config file choosing the simulator), ends
    it and nothing is written for it beside the database (a template outliving its command
    cannot be: it dies with it, see engine.roles.lifecycle)."""
    config = tmp_path / "sim.toml"
    config.write_text('[cluster]\nbackend = "sim"\n')
    db = tmp_path / "runs.db"
    refused = psctl("launch", "--dataset", "digits", "--workers", "9999", "--no-live", db=db)
    assert refused.returncode == 2
    assert not (tmp_path / "psctl-logs").exists()
    simulated = psctl("launch", "--config", str(config), "--dataset", "digits", "--epochs", "1",
                      "--no-live", db=db)
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    assert query(db, "SELECT count(*) FROM events WHERE kind = 'start_up'")[0][0] == 0


def _templates_under(pid: int) -> list[psutil.Process]:
    """The template processes among ``pid``'s children (the launcher starts its template)."""
    found = []
    for child in psutil.Process(pid).children():
        try:
            if "engine.roles.template" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_run_that_does_not_take_the_early_template_does_not_keep_it_while_it_runs(
        tmp_path: Path) -> None:
    """A config file that turns the template off: the run's roles start as fresh processes and
    the template psctl launch started early is gone before the run ends."""
    config = tmp_path / "fresh.toml"
    config.write_text("[cluster]\ntemplate = false\n")
    db = tmp_path / "runs.db"
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    launch = subprocess.Popen(
        [sys.executable, "-m", "psctl", "launch", "--config", str(config), "--dataset",
         "digits", "--workers", "2", "--servers", "1", "--epochs", "500", "--no-live"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: query(db, "SELECT count(*) FROM iterations")[0][0] > 4, 120,
                 "training")
        assert _templates_under(launch.pid) == []
        joins = _details(db, "process_joined")
        assert joins and all(j["forked"] is False for j in joins)
    finally:
        launch.send_signal(signal.SIGINT)
        launch.communicate(timeout=60)
