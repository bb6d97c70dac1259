"""Simulator tests measure into a private calibration cache, never the user's. The wire's costs,
which real runs measure (engine.sim.calibrate: about 20 seconds of real processes), are given
here, so that most tests start no process; tests/engine/sim/test_calibrate.py measures them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.sim.costs import wire_key

# Of the order this machine measures (engine.sim.calibrate), fixed so that timings repeat.
WIRE = {"worker_message_s": 5e-05, "server_message_s": 1e-04, "worker_send_byte_s": 5e-10,
        "worker_recv_byte_s": 5e-10, "server_recv_byte_s": 5e-10, "server_send_byte_s": 5e-10,
        "worker_iteration_s": 5e-04, "row_s": 5e-05}


@pytest.fixture(autouse=True)
def sim_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "sim-calibration.json"
    path.write_text(json.dumps({wire_key(name): WIRE for name in ("tcp", "websocket")}))
    monkeypatch.setenv("PSCTL_SIM_CACHE", str(path))
    return path
