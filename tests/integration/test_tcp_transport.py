"""``--transport tcp``: the shard servers serve workers, the evaluator and their chain
successors over the TCP transport. A real BSP run over it must train exactly as one over
websockets (each BSP round is the mean of the same gradients; only timing may differ), with
every copy of every key range linked over TCP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import psctl
from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_run_over_tcp_trains_exactly_as_one_over_websockets(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    for name, transport in (("tcp", "tcp"), ("websocket", "websocket")):
        done = psctl("launch", "--dataset", "digits", "--workers", "2", "--servers", "2",
                     "--replicas", "1", "--sync", "bsp", "--epochs", "2", "--name", name,
                     "--transport", transport, "--no-live", db=db)
        assert done.returncode == 0, done.stderr
    ids = {name: str(query(db, "SELECT id FROM runs WHERE name = ?", name)[0][0])
           for name in ("tcp", "websocket")}
    for name, scheme in (("tcp", "tcp://"), ("websocket", "ws://")):
        listening = [json.loads(detail) for (detail,) in query(
            db, "SELECT detail FROM events WHERE run_id = ? AND kind = 'server_listening'",
            ids[name])]
        addresses = [a for event in listening for a in event["copies"].values()]
        assert len(listening) == 2 and len(addresses) == 4, listening  # 2 copies per server
        assert all(address.startswith(scheme) for address in addresses), addresses
        config = json.loads(query(db, "SELECT config_json FROM runs WHERE id = ?",
                                  ids[name])[0][0])
        assert config["cluster"]["transport"] == name
    losses = {name: query(db, "SELECT worker, iteration, loss, staleness FROM iterations "
                              "WHERE run_id = ? ORDER BY worker, iteration", ids[name])
              for name in ids}
    assert len(losses["tcp"]) > 40
    assert losses["tcp"] == losses["websocket"]
    finals = {name: query(db, "SELECT accuracy, loss FROM evaluations WHERE run_id = ? "
                              "ORDER BY id DESC LIMIT 1", ids[name])[0] for name in ids}
    assert finals["tcp"] == finals["websocket"]  # to the bit; how well: bench/end_to_end.py
