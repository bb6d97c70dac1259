"""``--pipeline`` (the default) sends each iteration's next pull right behind its push. Two real
BSP runs, one with and one without it, must train exactly alike: with two workers a BSP round is
the mean of two gradients whatever their order, every process seeds its own random numbers, so
the only thing that may differ is timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import psctl
from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def launch(db: Path, name: str, *flags: str) -> None:
    done = psctl("launch", "--dataset", "digits", "--workers", "2", "--servers", "2",
                 "--sync", "bsp", "--epochs", "2", "--straggler", "1:3x", "--name", name,
                 "--no-live", *flags, db=db)
    assert done.returncode == 0, done.stderr


def losses_of(db: Path, ids: dict[str, str]) -> dict[str, list[tuple[int, int, float, int]]]:
    """Each run's (worker, iteration, loss, staleness) rows, in order."""
    return {name: query(db, "SELECT worker, iteration, loss, staleness FROM iterations "
                            "WHERE run_id = ? ORDER BY worker, iteration", run)
            for name, run in ids.items()}


def run_id(db: Path, name: str) -> str:
    return str(query(db, "SELECT id FROM runs WHERE name = ?", name)[0][0])


@pytest.mark.parametrize("loop", ["plain", "layered"])
def test_a_pipelined_run_trains_exactly_as_one_that_waits_for_each_ack(
        tmp_path: Path, loop: str) -> None:
    db = tmp_path / "experiments.db"
    launch(db, "pipelined", "--loop", loop, "--pipeline")
    launch(db, "waiting", "--loop", loop, "--no-pipeline")
    ids = {name: run_id(db, name) for name in ("pipelined", "waiting")}
    configs = {name: query(db, "SELECT config_json FROM runs WHERE id = ?", ids[name])[0][0]
               for name in ids}
    assert '"pipeline":true' in configs["pipelined"].replace(" ", "")
    assert '"pipeline":false' in configs["waiting"].replace(" ", "")
    losses = losses_of(db, ids)
    assert len(losses["pipelined"]) > 40
    assert losses["pipelined"] == losses["waiting"]
    assert {row[3] for row in losses["pipelined"]} == {0}
    finals = {name: query(db, "SELECT accuracy, loss FROM evaluations WHERE run_id = ? "
                              "ORDER BY id DESC LIMIT 1", ids[name])[0] for name in ids}
    assert finals["pipelined"] == finals["waiting"]


def test_a_wait_free_run_trains_exactly_as_a_layered_one(tmp_path: Path) -> None:
    """The wait-free loop sends the layered loop's frames, only earlier (from inside backward)."""
    db = tmp_path / "experiments.db"
    launch(db, "wait-free", "--loop", "wait-free")
    launch(db, "layered", "--loop", "layered")
    ids = {name: run_id(db, name) for name in ("wait-free", "layered")}
    losses = losses_of(db, ids)
    assert len(losses["wait-free"]) > 40
    assert losses["wait-free"] == losses["layered"]
    finals = {name: query(db, "SELECT accuracy, loss FROM evaluations WHERE run_id = ? "
                              "ORDER BY id DESC LIMIT 1", ids[name])[0] for name in ids}
    assert finals["wait-free"] == finals["layered"]


def test_layer_pulls_from_inside_backward_train_exactly_as_one_pull_after_it(
        tmp_path: Path) -> None:
    """--layer-pulls sends each layer's next pull right behind its push, during backward: the
    values that land are the round's all the same (BSP answers a layer once it is complete)."""
    db = tmp_path / "experiments.db"
    launch(db, "layer pulls", "--loop", "wait-free", "--layer-pulls")
    launch(db, "one pull", "--loop", "wait-free")
    ids = {name: run_id(db, name) for name in ("layer pulls", "one pull")}
    config = query(db, "SELECT config_json FROM runs WHERE id = ?", ids["layer pulls"])[0][0]
    assert '"layer_pulls":true' in config.replace(" ", "")
    losses = losses_of(db, ids)
    assert len(losses["layer pulls"]) > 40
    assert losses["layer pulls"] == losses["one pull"]
    assert {row[3] for row in losses["layer pulls"]} == {0}


def test_a_scheduled_run_computing_layer_by_layer_trains_exactly_as_a_layered_one(
        tmp_path: Path) -> None:
    """--schedule fifo pulls layer by layer, the forward pass starting on each layer once its
    own values are in: it must compute on exactly the values a whole pull would bring."""
    db = tmp_path / "experiments.db"
    launch(db, "scheduled", "--schedule", "fifo")
    launch(db, "layered", "--loop", "layered", "--no-pipeline")
    ids = {name: run_id(db, name) for name in ("scheduled", "layered")}
    losses = losses_of(db, ids)
    assert len(losses["scheduled"]) > 40
    assert losses["scheduled"] == losses["layered"]
    layers = query(db, "SELECT COUNT(*) FROM layer_iterations WHERE run_id = ?",
                   ids["scheduled"])[0][0]
    assert layers == 8 * len(losses["scheduled"])  # 4 layers, each a weight and a bias
