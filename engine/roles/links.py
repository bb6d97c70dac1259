"""The links a run's regime gives its roles (``--network``, ``--server-network``): a worker's
and a shard server's data-plane connections shaped to them (``engine.transport.shaping``), as
the simulator models them (``engine.sim.network``). A run that names neither talks over the
machine's own loopback, unshaped. The control plane and the evaluator's pulls are left alone:
they are not the training's traffic (the simulator's evaluator reads over loopback too)."""

from __future__ import annotations

from engine.config import RunConfig
from engine.transport.admission import Admission
from engine.transport.base import Transport
from engine.transport.shaping import LOOPBACK, NetworkModel, parse_network, shaped


def _model(spec: str | None) -> NetworkModel:
    return LOOPBACK if spec is None else parse_network(spec)


def _shaping(config: RunConfig) -> tuple[NetworkModel, NetworkModel] | None:
    """(a worker's link, a server's), or None when the run shapes nothing."""
    regime = config.regime
    if regime.network is None and regime.server_network is None:
        return None
    return _model(regime.network), _model(regime.server_network or regime.network)


def worker_transport(transport: Transport, config: RunConfig) -> Transport:
    """A worker's data plane: its link, to the servers' links."""
    links = _shaping(config)
    if links is None:
        return transport
    worker, server = links
    return shaped(transport, worker, lambda admission: server)


def server_transport(transport: Transport, config: RunConfig) -> Transport:
    """A shard server's data plane: its link, to the workers' (and to the servers' of its
    chain); the evaluator's and the operator's connections unshaped."""
    links = _shaping(config)
    if links is None:
        return transport
    worker, server = links

    def peer_of(admission: Admission | None) -> NetworkModel | None:
        if admission is None or admission.role == "server":  # its chain: servers both ways
            return server
        return worker if admission.role == "worker" else None

    return shaped(transport, server, peer_of)
