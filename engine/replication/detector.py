"""Is a shard server still alive? An accrual failure detector over its heartbeat arrivals.

This is the φ accrual detector of Hayashibara et al. (SRDS 2004), as Cassandra and Akka use it:
instead of a fixed timeout, the detector keeps the gaps between a server's last beats and says
how unlikely its present silence is under their normal distribution,

    φ(t) = -log10 P(gap > t),   gap ~ N(mean, max(std, min_std)²) shifted by ``pause_s``,

and suspects the server once φ passes ``threshold`` (8: one false suspicion in 10^8 beats if the
gaps were normal). On a machine whose beats come late and irregularly the mean and spread grow,
and so does the silence it takes to suspect; ``pause_s`` (``cluster.heartbeat_timeout_s``) is a
pause every server is allowed on top (Akka's ``acceptable-heartbeat-pause``), and a silence of
``ceiling_s`` is suspected whatever the history (the stated bound).

Silence is counted in the observer's awake time: the coordinator calls :meth:`tick` every
``interval_s``, and a tick that comes later than twice that means the coordinator itself did not
run, so the excess counts for nobody (beats that arrived meanwhile wait in its socket). A busy
coordinator therefore never takes its own stall for its servers' silence.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

THRESHOLD = 8.0
WINDOW = 100
CEILING_PAUSES = 10  # ceiling_s = this many pause_s


@dataclass
class Arrivals:
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    silent_s: float = 0.0  # awake seconds since the last beat
    seq: int = -1
    loop_lag_s: float = 0.0  # as the last beat reported it


class Detector:
    def __init__(self, pause_s: float, interval_s: float, *, threshold: float = THRESHOLD,
                 min_std_s: float | None = None) -> None:
        self.pause_s, self.interval_s, self.threshold = pause_s, interval_s, threshold
        self.min_std_s = interval_s / 2 if min_std_s is None else min_std_s
        self.ceiling_s = CEILING_PAUSES * pause_s
        self.arrivals: dict[int, Arrivals] = {}
        self._last_tick: float | None = None
        self.stalled_s = 0.0  # the observer's own stalls, excluded from every silence

    def watch(self, rank: int) -> None:
        """Count ``rank``'s silence from now, with a fresh history (a server started again)."""
        self.arrivals[rank] = Arrivals()

    def forget(self, rank: int) -> None:
        self.arrivals.pop(rank, None)

    def heard(self, rank: int, seq: int, loop_lag_s: float = 0.0) -> bool:
        """A beat arrived; False for a rank not watched or a beat older than one seen."""
        arrivals = self.arrivals.get(rank)
        if arrivals is None or seq <= arrivals.seq:
            return False
        if arrivals.seq >= 0:
            arrivals.gaps.append(arrivals.silent_s)
        arrivals.seq, arrivals.silent_s, arrivals.loop_lag_s = seq, 0.0, loop_lag_s
        return True

    def tick(self, now: float) -> None:
        """Advance every silence by the awake time since the last tick."""
        if self._last_tick is not None:
            elapsed = max(0.0, now - self._last_tick)
            counted = min(elapsed, 2 * self.interval_s)
            self.stalled_s += elapsed - counted
            for arrivals in self.arrivals.values():
                arrivals.silent_s += counted
        self._last_tick = now

    def phi(self, rank: int) -> float:
        arrivals = self.arrivals[rank]
        gaps = arrivals.gaps or deque([self.interval_s])
        mean = statistics.fmean(gaps)
        std = max(statistics.pstdev(gaps) if len(gaps) > 1 else 0.0, self.min_std_s)
        z = (arrivals.silent_s - mean - self.pause_s) / std
        later = 0.5 * math.erfc(z / math.sqrt(2))
        return -math.log10(later) if later > 0 else math.inf

    def suspected(self, rank: int) -> bool:
        arrivals = self.arrivals[rank]
        if arrivals.silent_s <= self.pause_s:
            return False
        return arrivals.silent_s >= self.ceiling_s or self.phi(rank) > self.threshold

    def silent_s(self, rank: int) -> float:
        return self.arrivals[rank].silent_s

    def loop_lag_s(self, rank: int) -> float:
        return self.arrivals[rank].loop_lag_s
