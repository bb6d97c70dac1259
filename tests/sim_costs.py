"""The wire's costs the tests give the simulator, so that no test but the calibration's own
(tests/engine/sim/test_calibrate.py) starts its real runs (about 20 seconds each time)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.sim.costs import overheads_key

# Of the order this machine measures (engine.sim.calibrate), fixed so that timings repeat.
WIRE = {"worker_message_s": 5e-05, "server_message_s": 1e-04, "worker_send_byte_s": 5e-10,
        "worker_recv_byte_s": 5e-10, "server_recv_byte_s": 5e-10, "server_send_byte_s": 5e-10,
        "worker_iteration_s": 5e-04, "row_s": 5e-05, "contention": 0.1}


def seeded_cache(path: Path) -> Path:
    """A calibration cache at ``path`` holding the wire's costs of both transports."""
    path.write_text(json.dumps({overheads_key(name): WIRE for name in ("tcp", "websocket")}))
    return path
