"""The coordinator's failure detector for shard servers (with replicas): heartbeat datagrams in,
verdicts out (``docs/fault-tolerance.md``, "When is a server dead?").

A server is fenced (killed, so that it can never serve again, and failed over) only when

- its process is gone or stopped (``SIGSTOP``, a debugger) once its beats are suspect: φ above
  the threshold of :mod:`engine.replication.detector`, or a silence of ``ceiling_s``;
- it is asleep with its CPU time still for ``pause_s`` more after that (blocked for good);
- its beats say its event loop has not turned for ``stall_s`` (hung), or it works but has sent
  no beat for ``stall_s``;
- on another machine, where the operating system cannot be asked: once its beats are suspect.

A server that is suspect but runnable, or whose CPU time moves, is slow, not dead: it is waited
for, and said so once (``server_slow``). A server holding the last copy of a key range is never
fenced: killing it would lose the range, so it is waited for (``fence_withheld``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import ProtocolError
from engine.replication.detector import Detector
from engine.roles.probe import Look, State, look
from engine.wire import beats

log = logging.getLogger(__name__)


class BeatReceiver(asyncio.DatagramProtocol):
    """Decodes each datagram; what is not a beat of this run is counted and dropped."""

    def __init__(self, token: str, on_beat: Callable[[beats.Beat], None]) -> None:
        self.token, self.on_beat = token, on_beat
        self.refused = 0

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            beat = beats.decode(data, self.token)
        except ProtocolError as exc:
            self.refused += 1
            if self.refused == 1:  # said once: a flood of junk must not flood the log
                log.warning("dropped a datagram from %s: %s", addr, exc)
            return
        self.on_beat(beat)


async def open_receiver(host: str, token: str, on_beat: Callable[[beats.Beat], None]
                        ) -> tuple[asyncio.DatagramTransport, BeatReceiver, int]:
    """A UDP socket on ``host`` (any free port) taking the run's beats."""
    loop = asyncio.get_running_loop()
    transport, receiver = await loop.create_datagram_endpoint(
        lambda: BeatReceiver(token, on_beat), local_addr=(host, 0))
    port = int(transport.get_extra_info("sockname")[1])
    return transport, receiver, port


@dataclass(frozen=True)
class Verdict:
    action: str  # "ok", "slow" (said once), "fence", "withheld" (said once)
    reason: str = ""
    silent_s: float = 0.0
    state: str = ""


@dataclass
class _Suspicion:
    cpu_s: float | None = None
    idle_from_s: float | None = None  # the silence at which it was first seen asleep
    said: set[str] = field(default_factory=set)


class ServerWatch:
    def __init__(self, detector: Detector, stall_s: float,
                 probe: Callable[[int, float | None], Look] = look) -> None:
        self.detector, self.stall_s, self.probe = detector, stall_s, probe
        self._suspicions: dict[int, _Suspicion] = {}

    def watch(self, rank: int) -> None:
        self.detector.watch(rank)
        self._suspicions.pop(rank, None)

    def forget(self, rank: int) -> None:
        self.detector.forget(rank)
        self._suspicions.pop(rank, None)

    def judge(self, rank: int, pid: int, *, ours: bool, last_copy: bool) -> Verdict:
        """What to do about server ``rank`` now; a verdict said once per suspicion comes back
        as ``ok`` when repeated."""
        verdict = self._verdict(rank, pid, ours)
        if verdict.action == "fence" and last_copy:
            verdict = Verdict("withheld", verdict.reason, verdict.silent_s, verdict.state)
        if verdict.action in ("slow", "withheld"):
            said = self._suspicions.setdefault(rank, _Suspicion()).said
            if verdict.action in said:
                return Verdict("ok", silent_s=verdict.silent_s)
            said.add(verdict.action)
        return verdict

    def _verdict(self, rank: int, pid: int, ours: bool) -> Verdict:
        detector = self.detector
        silent = detector.silent_s(rank)
        lag = detector.loop_lag_s(rank)
        if lag >= self.stall_s:
            return Verdict("fence", f"its event loop has not turned for {lag:.1f} s", silent,
                           "hung")
        if not detector.suspected(rank):
            self._suspicions.pop(rank, None)
            return Verdict("ok", silent_s=silent)
        phi = detector.phi(rank)
        heard = f"no heartbeat for {silent:.2f} s (φ = {phi:.1f})"
        if not ours:
            return Verdict("fence", heard, silent, "remote")
        suspicion = self._suspicions.setdefault(rank, _Suspicion())
        seen = self.probe(pid, suspicion.cpu_s)
        suspicion.cpu_s = seen.cpu_s
        if seen.state in (State.GONE, State.STOPPED):
            return Verdict("fence", f"{heard}, and its process is {seen.state.value}", silent,
                           seen.state.value)
        if seen.state is State.WORKING:
            suspicion.idle_from_s = None
            if silent >= self.stall_s:
                return Verdict("fence", f"{heard}, though its process works", silent, "deaf")
            return Verdict("slow", f"{heard}, but its process works: waiting for it", silent,
                           "working")
        if suspicion.idle_from_s is None:
            suspicion.idle_from_s = silent
        if silent - suspicion.idle_from_s >= detector.pause_s:
            return Verdict("fence", f"{heard}, and its process sleeps without using CPU",
                           silent, "idle")
        return Verdict("ok", silent_s=silent)
