from __future__ import annotations

import pytest

from engine.errors import ConfigError
from engine.sim.network import LOOPBACK, Link, link_of, parse_network, transmit


@pytest.mark.parametrize(("text", "rate", "latency", "spec"), [
    ("10gbit:50us", 1.25e9, 50e-6, "10gbit:50us"),
    ("1GBit:0.2ms", 1.25e8, 2e-4, "1gbit:0.2ms"),
    ("100mbyte:0s", 1e8, 0.0, "100mbyte:0s"),
])
def test_parse(text: str, rate: float, latency: float, spec: str) -> None:
    model = parse_network(text)
    assert model.bytes_per_s == pytest.approx(rate)
    assert model.latency_s == pytest.approx(latency)
    assert model.spec == spec


@pytest.mark.parametrize(("text", "says"), [
    ("10gbit", "BANDWIDTH:LATENCY"), ("10gb:1ms", "bandwidth unit"),
    ("10gbit:1min", "latency unit"), ("0gbit:1ms", "between"), ("1gbit:11s", "at most 10 s"),
    ("1..2gbit:1ms", "not a number"),
])
def test_bad_specs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_network(text)


def test_links_are_fifo_on_both_ends() -> None:
    model = parse_network("8kbit:1s")  # 1000 bytes per second
    a, b, server = Link(model), Link(model), Link(model)
    assert transmit(0.0, a, server, 500) == pytest.approx(1.5)
    # b's message waits for the server's incoming side to be free
    assert transmit(0.0, b, server, 500) == pytest.approx(2.0)
    # a's next message waits for nothing on a's side (free at 0.5) but the server's (at 1.0)
    assert transmit(0.6, a, server, 1000) == pytest.approx(3.0)


def test_each_side_takes_its_own_bandwidth_and_the_larger_latency() -> None:
    worker = Link(parse_network("8kbit:1s"))  # 1000 bytes per second
    server = Link(parse_network("80kbit:2s"))  # 10000 bytes per second
    assert transmit(0.0, worker, server, 1000) == pytest.approx(1.0 + 2.0)
    assert server.in_free == pytest.approx(0.1) and worker.out_free == pytest.approx(1.0)


def test_a_busy_receiver_delays_the_arrival_not_the_senders_side() -> None:
    """As the real shaper paces them: the sender's side sends at once; the receiver's side takes
    the bytes from their first one's departure or once it is free, whichever is later."""
    model = parse_network("8kbit:0s")  # 1000 bytes per second
    one, two, server = Link(model), Link(model), Link(model)
    assert transmit(0.0, one, server, 1000) == pytest.approx(1.0)
    assert transmit(0.0, two, server, 1000) == pytest.approx(2.0)
    assert two.out_free == pytest.approx(1.0)  # two's own side was free after 1 s


def test_loopback_takes_no_time_of_its_own() -> None:
    assert link_of(None).model is LOOPBACK
    assert transmit(5.0, link_of(None), link_of(None), 10**8) == pytest.approx(5.0)
