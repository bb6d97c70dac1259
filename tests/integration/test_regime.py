"""Real processes take the regime a run gives (issue 55): each batch padded to --compute-ms,
each data-plane connection shaped to --network; and a simulated study's points checked on real
processes (psctl study --backend local)."""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

import pytest

from tests.conftest import psctl, psctl_in_process
from tests.integration.support import cpu_hogs, query
from tests.study_text import sync_axis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_local_run_is_padded_and_shaped(tmp_path: Path) -> None:
    db = tmp_path / "regime.db"
    # digits' 3 x 512 MLP: 563,722 keys, 2.25 MB a frame, 0.18 s of it at 100 Mbit/s; two
    # CPU hogs beside the run: the padding and the shaping hold on a crowded machine.
    with cpu_hogs(2):
        done = psctl("launch", "--dataset", "digits", "--workers", "1", "--servers", "1",
                     "--train-limit", "640", "--epochs", "1", "--compute-ms", "40",
                     "--network", "100mbit:5ms", "--no-live", db=db)
    assert done.returncode == 0, done.stderr
    rows = query(db, "SELECT compute_s, pull_s + wait_s, push_s FROM iterations")
    assert len(rows) == 10
    compute, pull, push = (statistics.median(column) for column in zip(*rows, strict=True))
    assert 0.040 <= compute < 0.040 + 0.1
    frame = 4 * 563_722 / 12.5e6
    for phase in (pull, push):  # the frame's bytes, a latency (and a small request's)
        assert frame + 0.005 <= phase < frame + 0.010 + 0.2


STUDY = """
[study]
name = "tiny"
title = "a simulated study, checked on real processes"
target = 0.5

[base]
cluster.backend = "sim"
cluster.workers = 2
cluster.servers = 1
data.dataset = "digits"
data.train_limit = 512
model.hidden = [32]
train.epochs = 1
regime.compute_ms = 30.0
regime.network = "1gbit:1ms"
sim.costs = "given"
sim.server_ms = 1.0

""" + sync_axis("bsp", "asp") + """
"""


def test_a_simulated_study_runs_on_real_processes_in_its_regime(tmp_path: Path) -> None:
    study = tmp_path / "tiny.toml"
    study.write_text(textwrap.dedent(STUDY))
    db = tmp_path / "study.db"
    done = psctl("study", str(study), "--backend", "local", "--only", "sync=ASP", db=db)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "results" / "tiny-local" / "summary.json").read_text())
    assert summary["backends"] == ["local"] and len(summary["rows"]) == 1
    assert "--backend local --only sync=ASP" in summary["command"]
    (config,) = (json.loads(c) for (c,) in query(db, "SELECT config_json FROM runs"))
    assert config["cluster"]["backend"] == "local" and config["sync"]["model"] == "asp"
    assert config["regime"] == {"compute_ms": 30.0, "network": "1gbit:1ms",
                                "server_network": None}
    assert config["sim"]["costs"] == "measured"  # the simulator's settings left out
    assert min(c for (c,) in query(db, "SELECT compute_s FROM iterations")) >= 0.030


def test_an_axis_value_unknown_or_of_the_simulator_alone_is_refused(tmp_path: Path) -> None:
    study = tmp_path / "tiny.toml"
    study.write_text(textwrap.dedent(STUDY))
    db = tmp_path / "study.db"
    unknown = psctl_in_process("study", str(study), "--only", "sync=SSP", "--dry-run", db=db)
    assert unknown.returncode != 0 and "axis sync has no value 'SSP'" in unknown.stderr
    only_sim = study.read_text().replace('set = { "sync.model" = "asp" }',
                                         'set = { "sim.server_ms" = 2.0 }')
    study.write_text(only_sim)
    refused = psctl_in_process("study", str(study), "--backend", "local", "--dry-run", db=db)
    assert refused.returncode != 0 and "varies only sim.* settings" in refused.stderr
