"""Which of a role's connections its regime shapes (engine.roles.links): a worker's to the
servers; a server's to workers and to its chain; never the evaluator's nor the control plane."""

from __future__ import annotations

from engine.plan import build_config
from engine.roles.links import server_transport, worker_transport
from engine.transport.admission import Admission
from engine.transport.shaping import LOOPBACK, ShapedTransport, parse_network
from engine.transport.tcp import TcpTransport

DIGITS = {"data.dataset": "digits"}


def test_an_unshaped_run_keeps_its_transport() -> None:
    transport = TcpTransport()
    config = build_config({}, DIGITS)
    assert worker_transport(transport, config) is transport
    assert server_transport(transport, config) is transport


def test_each_end_takes_its_own_link_and_knows_its_peers() -> None:
    config = build_config({}, DIGITS | {"regime.network": "100mbit:5ms",
                                        "regime.server_network": "1gbit:1ms"})
    worker, server = parse_network("100mbit:5ms"), parse_network("1gbit:1ms")
    shaped = worker_transport(TcpTransport(), config)
    assert isinstance(shaped, ShapedTransport)
    assert shaped.shaper.own == worker and shaped.peer_of(None) == server
    serving = server_transport(TcpTransport(), config)
    assert isinstance(serving, ShapedTransport) and serving.shaper.own == server
    assert serving.peer_of(Admission("worker", 3)) == worker
    assert serving.peer_of(Admission("server", 1)) == server  # a chain's predecessor
    assert serving.peer_of(None) == server  # the chain link it opens
    assert serving.peer_of(Admission("evaluator", 0)) is None
    assert serving.peer_of(Admission(None, None)) is None  # the operator's tools


def test_a_server_network_alone_leaves_the_workers_on_loopback() -> None:
    config = build_config({}, DIGITS | {"regime.server_network": "200mbit:100us"})
    shaped = worker_transport(TcpTransport(), config)
    assert isinstance(shaped, ShapedTransport) and shaped.shaper.own == LOOPBACK
    assert shaped.peer_of(None) == parse_network("200mbit:100us")
