"""The simulator's calibration on real runs (engine.sim.calibrate): the costs it derives from
the runs' CPU, on figures made from known costs; and, with real processes, that its runs give
costs of this machine's order."""

from __future__ import annotations

import pytest

from engine.sim.calibrate import Measured, derive, measure

TRUE = {"worker_message_s": 60e-6, "server_message_s": 110e-6, "worker_byte_s": 0.9e-9,
        "server_byte_s": 1.1e-9, "worker_iteration_s": 0.7e-3, "row_s": 90e-6}
GRADIENT = {"large": 3e-3, "small": 0.2e-3}
UPDATE = 1e-9  # per key


def run(keys: int, servers: int, iterations: int = 1000) -> Measured:
    """What the processes of a run of ``keys`` over ``servers`` servers spend, by the costs."""
    frame = 4 * keys
    worker = (GRADIENT["large" if keys > 10_000 else "small"] + 4 * servers
              * TRUE["worker_message_s"] + TRUE["worker_byte_s"] * frame
              + TRUE["worker_iteration_s"])
    server = 4 * TRUE["server_message_s"] + TRUE["server_byte_s"] * frame + UPDATE * keys
    cpu = {"worker 0": worker * iterations, "coordinator": TRUE["row_s"] * iterations / 2,
           "launcher": TRUE["row_s"] * iterations / 2}
    cpu |= {f"server {s}": server * iterations / servers for s in range(servers)}
    return Measured(iterations, keys, cpu)


def test_the_costs_are_what_the_runs_spent_beyond_gradient_and_update() -> None:
    measured = {"large": run(900_000, 1), "small": run(1_210, 1), "two": run(1_210, 2)}
    alone = {name: (GRADIENT[name], UPDATE) for name in ("large", "small")}
    costs = derive(measured, alone)
    assert costs["worker_message_s"] == pytest.approx(TRUE["worker_message_s"])
    assert costs["server_message_s"] == pytest.approx(TRUE["server_message_s"])
    assert costs["worker_send_byte_s"] + costs["worker_recv_byte_s"] == pytest.approx(
        TRUE["worker_byte_s"])
    assert costs["server_send_byte_s"] + costs["server_recv_byte_s"] == pytest.approx(
        TRUE["server_byte_s"])
    assert costs["worker_iteration_s"] == pytest.approx(TRUE["worker_iteration_s"])
    assert costs["row_s"] == pytest.approx(TRUE["row_s"])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_real_runs_give_costs_of_this_machines_order() -> None:
    costs = measure("tcp")
    # Tens to hundreds of microseconds a message, a tenth to a few nanoseconds a byte: a
    # 3.7 MB frame costs each end a few milliseconds on this machine kind.
    assert 1e-6 < costs["worker_message_s"] < 2e-3 and 1e-6 < costs["server_message_s"] < 2e-3
    for side in ("worker_send", "worker_recv", "server_send", "server_recv"):
        assert 0.05e-9 < costs[f"{side}_byte_s"] < 10e-9, side
    assert 0 <= costs["worker_iteration_s"] < 5e-3 and 0 < costs["row_s"] < 2e-3
    assert 0 <= costs["contention"] < 1  # this machine kind: about 0.1


def test_a_message_cost_lost_in_noise_is_taken_from_the_server_s() -> None:
    """A busy CI machine gave the two-server run less worker CPU than the one-server run: a
    worker's message cost of zero, which no real run has."""
    two = run(1_210, 2)
    quiet = Measured(two.iterations, two.keys,
                     two.cpu | {"worker 0": two.cpu["worker 0"] * 0.8})
    measured = {"large": run(900_000, 1), "small": run(1_210, 1), "two": quiet}
    costs = derive(measured, {name: (GRADIENT[name], UPDATE) for name in ("large", "small")})
    assert costs["worker_message_s"] == pytest.approx(TRUE["server_message_s"])
    assert costs["worker_iteration_s"] > 0


def test_a_byte_cost_lost_in_noise_is_taken_from_the_other_end_s() -> None:
    """A loaded CI machine gave a server's per-byte cost of zero (its update, timed alone,
    came out dearer than in the run)."""
    large = run(900_000, 1)
    noisy = Measured(large.iterations, large.keys,
                     large.cpu | {"server 0": large.cpu["server 0"] * 0.1})
    measured = {"large": noisy, "small": run(1_210, 1), "two": run(1_210, 2)}
    costs = derive(measured, {name: (GRADIENT[name], UPDATE) for name in ("large", "small")})
    assert costs["server_send_byte_s"] + costs["server_recv_byte_s"] == pytest.approx(
        TRUE["worker_byte_s"])
    assert costs["server_message_s"] > 0
