"""The network model: every endpoint (a worker, a shard server) has one link; workers' links
have ``sim.network``'s bandwidth and latency, servers' links ``sim.server_network``'s (the same
unless set). A message occupies the sender's outgoing side for ``bytes / its bandwidth`` and the
receiver's incoming side for ``bytes / its bandwidth``, first come first served on each, and
arrives when the slower of the two is done plus the larger latency. The frames of one request
(a push cut per shard) leave their sender together, interleaved as a socket per shard would,
and all arrive when the whole request has passed the sender's link."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from engine.errors import ConfigError

_BANDWIDTH_UNITS = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8,
                    "gbyte": 1e9, "mbyte": 1e6, "kbyte": 1e3}
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_SPEC = re.compile(r"^\s*(?P<bw>[0-9.]+(?:e[+-]?\d+)?)(?P<bwu>[a-z]+)\s*:\s*"
                   r"(?P<lat>[0-9.]+(?:e[+-]?\d+)?)(?P<latu>[a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class NetworkModel:
    bytes_per_s: float
    latency_s: float
    spec: str

    def transfer_s(self, nbytes: int) -> float:
        """Time a message of ``nbytes`` occupies a link (without the latency)."""
        return nbytes / self.bytes_per_s


def parse_network(text: str) -> NetworkModel:
    """``BANDWIDTH:LATENCY``, e.g. ``10gbit:50us``; bandwidth in gbit, mbit, kbit, gbyte, mbyte or
    kbyte per second, latency in s, ms, us or ns."""
    match = _SPEC.match(text.lower())
    if match is None:
        raise ConfigError(f"network {text!r} is not BANDWIDTH:LATENCY, e.g. 10gbit:50us or "
                          "1gbit:0.2ms")
    bw_unit, lat_unit = match["bwu"], match["latu"]
    if bw_unit not in _BANDWIDTH_UNITS:
        raise ConfigError(f"network {text!r}: bandwidth unit {bw_unit!r} is not one of "
                          f"{', '.join(_BANDWIDTH_UNITS)}")
    if lat_unit not in _LATENCY_UNITS:
        raise ConfigError(f"network {text!r}: latency unit {lat_unit!r} is not one of "
                          f"{', '.join(_LATENCY_UNITS)}")
    try:
        bandwidth, latency = float(match["bw"]), float(match["lat"])
    except ValueError:
        raise ConfigError(f"network {text!r}: not a number") from None
    rate = bandwidth * _BANDWIDTH_UNITS[bw_unit]
    if not (math.isfinite(rate) and 1e3 <= rate <= 1e15):
        raise ConfigError(f"network {text!r}: bandwidth must be between 8kbit and 8000000gbit")
    delay = latency * _LATENCY_UNITS[lat_unit]
    if not (math.isfinite(delay) and delay <= 10.0):
        raise ConfigError(f"network {text!r}: latency must be at most 10 s")
    spec = f"{bandwidth:g}{bw_unit}:{latency:g}{lat_unit}"
    return NetworkModel(rate, delay, spec)


class Link:
    """One endpoint's link: its model, and when its outgoing and incoming sides are next free
    (virtual s)."""

    __slots__ = ("in_free", "model", "out_free")

    def __init__(self, model: NetworkModel) -> None:
        self.model = model
        self.in_free = 0.0
        self.out_free = 0.0


def transmit(now: float, source: Link, target: Link, nbytes: int) -> float:
    """Occupy both sides for the message; returns when it arrives."""
    return transmit_group(now, source, [(target, nbytes)])


def transmit_group(now: float, source: Link, frames: list[tuple[Link, int]]) -> float:
    """Send frames to several targets at once, interleaved on the source's link; returns when
    they all have arrived."""
    start = max(now, source.out_free, *(target.in_free for target, _ in frames))
    sending = source.model.transfer_s(sum(nbytes for _, nbytes in frames))
    source.out_free = start + sending
    done = sending
    for target, nbytes in frames:
        receiving = target.model.transfer_s(nbytes)
        target.in_free = start + receiving
        done = max(done, receiving)
    latency = max(source.model.latency_s, *(target.model.latency_s for target, _ in frames))
    return start + done + latency
