"""The shard server's data plane: answers PUSH, PULL and INIT frames for one ``ShardState``.

Every frame is validated before it touches the state; a bad one is answered with an ERROR frame
naming the problem, and the connection (and every other) keeps being served. A peer that sends
nothing but garbage is disconnected after ``MAX_BAD_FRAMES`` with a close reason.

No peer can slow the others down or grow the server without bound: each connection has its own
outbound queue, drained by its own task and bounded in bytes (a peer that stops reading is
disconnected with code 1008 once its unread replies pass ``max_queued_bytes``), and the queues of
all connections of the process, with what their transports still hold in memory (also while a
connection closes), share one budget (``engine.server.limits``: past it the slowest readers go
first). Waiting pulls are indexed by the clock they wait for (``engine.server.waiting``:
a push looks only at pulls that may have become answerable), bounded per sender and per process,
and dropped when their connection leaves. A frame is checked against the keys this copy holds
before anything it declares is allocated. The warnings refused frames cause are rate-limited (the
rest are counted). A connection admitted as one worker may only send frames as that worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.aio import off_loop
from engine.consistency.base import Deferred, PushTiming
from engine.errors import (
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    PsctlError,
    ShardFull,
)
from engine.replication.link import ChainLink
from engine.server.limits import ServerBudget, ServerLimits
from engine.server.pull_filter import PullFilter, SendAll
from engine.server.shard import ShardState
from engine.server.waiting import GroupKey, Waiting, WaitingPulls
from engine.transport.base import Connection, Listener, Message, Transport
from engine.wire.codecs import Codec, narrow
from engine.wire.protocol import (
    CLOSE_MOVED,
    FLAG_COMMIT,
    FLAG_FINAL,
    FLOAT_DTYPES,
    MAX_LIST_KEYS,
    DType,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
    error_frame,
    frame_limit,
    from_ns,
    numpy_dtype,
    peek_request_id,
)
from engine.wire.records import SyncRecord

log = logging.getLogger(__name__)
# Decisions over at least this many predicted times (ElasticBSP: workers x R) run on a thread:
# at n x R = 38,400 one takes about 0.6 ms, at 2.56 M about 140 ms (bench/zipline.py).
OFFLOAD_FROM = 4096
MAX_BAD_FRAMES = 32
REMEMBERED_ACKS = 256  # per connection: far more pushes than a worker keeps in flight
CLOSE_POLICY = 1008  # websocket close code: the peer broke a rule (garbage, too slow a reader)
_FLUSH_TIMEOUT_S = 5.0


__all__ = ["LogBudget", "ServerBudget", "ServerLimits", "ServerStats", "ShardServer"]


class LogBudget:
    """A token bucket of log lines; what it holds back is counted and reported with the next."""

    def __init__(self, per_minute: int) -> None:
        self._rate, self._tokens = per_minute / 60.0, float(per_minute)
        self._cap, self._at = float(per_minute), time.monotonic()
        self.held_back = 0

    def take(self) -> int | None:
        """The number of lines held back since the last one, or None: hold this one back too."""
        now = time.monotonic()
        self._tokens = min(self._cap, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            self.held_back += 1
            return None
        self._tokens -= 1
        held, self.held_back = self.held_back, 0
        return held


class _Peer:
    """One connection: its outbound queue and the task draining it, its waiting pulls."""

    def __init__(self, connection: Connection, owner: ShardServer) -> None:
        self.connection = connection
        self.owner = owner
        self.budget = owner.budget
        self.queue: deque[bytearray] = deque()
        # Which queued frames carry values: an ACK or an ERROR is no reply a slow reader
        # holds up (a worker whose push released a barrier has its ACK queued before its pull's
        # reply, and is no slower a reader for it).
        self.valued: deque[bool] = deque()
        self.queued_bytes = 0
        self.head_since = 0.0
        self.pending = 0
        self.bad_frames = 0
        self.closing: str | None = None
        self.wake = asyncio.Event()
        self.log = LogBudget(owner.limits.warnings_per_minute)
        self.sender: asyncio.Task[None] | None = None
        self.close: asyncio.Task[None] | None = None  # the policy close under way, if any
        # The acks of this connection's latest pushes by request id: a push sent again (its
        # reply was lost) gets the same ack and is not applied twice.
        self.acked: OrderedDict[int, Frame | None] = OrderedDict()  # None: on its way
        # The worker whose pulls this connection carries, once one came: the pull filter
        # forgets what it sent that worker when a new connection of it pulls first.
        self.puller: int | None = None

    @property
    def queued_frames(self) -> int:
        """Queued frames that carry values (replies to pulls)."""
        return sum(self.valued)

    def unsent_bytes(self) -> int:
        return self.connection.unsent_bytes()

    def enqueue(self, data: bytearray, valued: bool) -> None:
        if not self.queue:
            self.head_since = self.owner.monotonic()
        self.queue.append(data)
        self.valued.append(valued)
        self.queued_bytes += len(data)
        self.budget.queued_bytes += len(data)
        self.wake.set()

    def sent(self) -> None:
        """The oldest reply left."""
        size = len(self.queue.popleft())
        self.valued.popleft()
        self.queued_bytes -= size
        self.budget.queued_bytes -= size
        self.head_since = self.owner.monotonic()

    def stop_sending(self) -> None:
        """Cancel the sending task and let go of it: Python 3.11 keeps a cancelled task's
        CancelledError, whose traceback holds the frames of ``send`` and the reply it was
        sending, and that cycle (task, frame, peer) waited for the garbage collector: 16 slow
        readers left 34 MB of replies behind them."""
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.cancel()

    def drop_queue(self) -> None:
        self.budget.queued_bytes -= self.queued_bytes
        self.queue.clear()
        self.valued.clear()
        self.queued_bytes = 0


@dataclass
class ServerStats:
    frames_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    bad_frames: int = 0
    errors_by_code: dict[str, int] = field(default_factory=dict)
    slow_readers_closed: int = 0
    internal_errors: int = 0
    warnings_held_back: int = 0
    resent_pushes: int = 0  # pushes that came again by request id (acked again, not applied)
    resent_pulls: int = 0  # pulls that came again while the first still waited
    refused_pulls: int = 0  # pulls that could not wait: their sender's or the server's bound


class ShardServer:
    def __init__(self, state: ShardState, *, run: bytes, rank: int, max_frame_bytes: int,
                 on_syncs: Callable[[list[SyncRecord]], None] | None = None,
                 limits: ServerLimits | None = None,
                 pull_filter: PullFilter | None = None,
                 budget: ServerBudget | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 offload_from: int | None = OFFLOAD_FROM,
                 made: Callable[[int], None] | None = None) -> None:
        # The simulator passes its virtual clock, runs every decision in place (a thread would
        # make its runs depend on this machine's timing) and charges the CPU of each frame this
        # server makes when it makes it (``made``, its size): a barrier's replies are made
        # before the ACK of the push that released it leaves, as here.
        self.monotonic, self._offload_from, self._made = monotonic, offload_from, made
        # Shared by the copies of one process (``engine.server.limits``); its own otherwise.
        self.budget = budget or ServerBudget(limits)
        self.limits = self.budget.limits if limits is None else limits
        self._waiting: WaitingPulls[_Peer] = WaitingPulls()
        self.pull_filter = pull_filter or SendAll()
        self.state = state
        self._decisions: set[asyncio.Task[None]] = set()
        self._on_syncs = on_syncs
        self.run = run
        self.rank = rank
        self.max_frame_bytes = max_frame_bytes
        self.stats = ServerStats()
        self._peers: set[_Peer] = set()
        self._draining = False
        self._listener: Listener | None = None
        # Replication (engine.replication): a backup serves only its chain predecessor until it
        # is promoted; ``link`` forwards every applied update to the successor, if any.
        self.primary = True
        self.link: ChainLink | None = None
        # Told why, when a push's keys do not fit (ShardFull): no later push will fit either,
        # so its process tells the coordinator, and the run ends with that reason.
        self.on_full: Callable[[str], None] | None = None
        self.promoted_at: float | None = None
        self.first_pull_at: float | None = None
        self.on_first_pull: Callable[[ShardServer], None] | None = None

    @property
    def state(self) -> ShardState:
        return self._state

    @state.setter
    def state(self, state: ShardState) -> None:
        if self._offload_from is not None:
            state.controller.offload(self._offload_from)
        self._state = state
        self.pull_filter.forget_all()
        self._waiting.regroup(self._group_of)  # its clock ranges may differ

    async def start(self, transport: Transport, host: str, port: int, *, token: str) -> str:
        self._listener = await transport.listen(
            host, port, self.serve, token=token,
            max_message_bytes=min(self.max_frame_bytes, frame_limit(len(self.state.keys))))
        return self._listener.address

    @property
    def address(self) -> str:
        if self._listener is None:
            raise ProtocolError("the shard server is not listening yet")
        return self._listener.address

    async def close(self) -> None:
        for task in list(self._decisions):
            task.cancel()
        self.drain("server shutting down")
        if self.link is not None:
            await self.link.close()
        if self._listener is not None:
            await self._listener.close()
        deadline = self.monotonic() + _FLUSH_TIMEOUT_S
        while any(peer.queue for peer in self._peers) and self.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def drain(self, reason: str) -> None:
        """Stop accepting pushes and waiting pulls; pulls that need no wait are still answered."""
        self._draining = True
        for pull in self._waiting.take_all():
            self._pull_ended(pull)
            self._reply_error(pull.peer, pull.frame.request_id, "shutting_down", reason)

    async def serve(self, connection: Connection) -> None:
        peer = _Peer(connection, self)
        peer.sender = asyncio.create_task(self._pump(peer))
        self._peers.add(peer)
        self.budget.readers.add(peer)
        try:
            await self._read(peer)
        finally:
            self._forget(peer)

    async def _read(self, peer: _Peer) -> None:
        while True:
            try:
                message = await peer.connection.recv()
            except ConnectionClosed:
                return
            if peer.closing is not None:  # disconnected for reading too slowly: ignore the rest
                if peer.close is not None:  # returning first would close with 1000, no reason
                    await peer.close
                return
            if self._handle(peer, message):
                continue
            peer.bad_frames += 1
            if peer.bad_frames >= MAX_BAD_FRAMES:
                await self._flush(peer, timeout=1.0)  # the peer should read why before the close
                await self._disconnect(peer, f"{peer.bad_frames} invalid frames; closing")
                return

    def _forget(self, peer: _Peer) -> None:
        """A connection ended: its queue, its sender and its waiting pulls go with it."""
        self._peers.discard(peer)
        self._let_go(peer)
        for pull in self._waiting.drop(peer):
            self._pull_ended(pull)
        peer.drop_queue()
        peer.acked.clear()
        peer.stop_sending()
        self.budget.release_memory()
        if peer.log.held_back:
            log.warning("%s left; %d more refused frames were not logged",
                        peer.connection.remote, peer.log.held_back)

    def _handle(self, peer: _Peer, message: Message) -> bool:
        """Process one message; False if it was invalid (an ERROR was sent back)."""
        self.stats.frames_in += 1
        self.stats.bytes_in += len(message)
        if isinstance(message, str):
            self._refuse(peer, 0, ProtocolError(
                "text message on a tensor connection: send binary psctl frames"))
            return False
        try:
            frame = decode(message, max_bytes=self.max_frame_bytes,
                           max_keys=len(self.state.keys))
            self._dispatch(peer, frame, message)
        except PsctlError as exc:
            self._refuse(peer, peek_request_id(message), exc)
            return False
        except Exception:  # a bug here must not drop the connection (1011) nor stop the server
            self.stats.internal_errors += 1
            log.exception("internal error on a frame from %s", peer.connection.remote)
            self._reply_error(peer, peek_request_id(message), "InternalError",
                              "the server failed on this frame; its log has the details")
            return False
        return True

    def _dispatch(self, peer: _Peer, frame: Frame, message: bytes | bytearray) -> None:
        if frame.run != self.run:
            raise ProtocolError("frame belongs to another run")
        admission = peer.connection.admission
        sender = frame.role.name.lower()
        # The chain's predecessor (a server) forwards the updates of every worker.
        chained = _chained(peer.connection)
        if chained and frame.type not in (MsgType.PUSH, MsgType.INIT):
            raise ProtocolError(f"a chain predecessor forwards pushes only, not {frame.type.name}")
        if admission is not None and not chained and not admission.permits(sender, frame.rank):
            raise ProtocolError(f"this connection was admitted as {admission}; it may not send "
                                f"frames as {sender} {frame.rank}")
        if not (self.primary or chained):
            self._reply_error(peer, frame.request_id, "not_primary",
                              f"server {self.rank} holds a backup of these keys, not the primary")
            return
        if frame.index is not None and len(frame.index) > MAX_LIST_KEYS:
            # One request must not hold the loop that serves every connection for long.
            raise FrameTooLarge(f"a {frame.type.name} of {len(frame.index):,} keys; a frame "
                                f"names at most {MAX_LIST_KEYS:,} (a client sends a longer "
                                "list in several)")
        if frame.type is MsgType.PULL:
            self._pull(peer, frame)
        elif frame.type is MsgType.PUSH:
            self._push(peer, frame, message, chained=chained)
        elif frame.type is MsgType.CLOCKS:
            self._send(peer, self._clocks(frame))
        elif frame.type is MsgType.INIT:
            applied = self.state.init(frame.keys, frame.values)
            ack = self._ack(frame, self.state.version_of(frame.keys))
            if applied and self.link is not None:
                self.link.forward(message).add_done_callback(lambda _: self._send(peer, ack))
            else:
                self._send(peer, ack)
            if applied:
                self.release_ready_pulls()
        else:
            raise ProtocolError(f"a server does not accept {frame.type.name} frames")

    def _pull(self, peer: _Peer, frame: Frame) -> None:
        self.state.check_readable(frame.keys, frame.index)  # before the pull may wait
        if frame.dtype not in FLOAT_DTYPES:
            raise ProtocolError(f"a pull asks for its values as {frame.dtype.name}; ask for "
                                "FLOAT32, FLOAT16, BFLOAT16 or FLOAT64")
        if self.state.pull_ready(frame.rank, frame.clock, frame.keys):
            self._answer_pull(peer, frame, waited_s=0.0)
        elif self._draining:
            self._reply_error(peer, frame.request_id, "shutting_down", "run is stopping")
        elif peer.pending and self._waiting.waits(peer, frame.request_id):
            self.stats.resent_pulls += 1  # sent again while it waits: the first one answers
        else:
            self._wait(peer, frame)

    def _wait(self, peer: _Peer, frame: Frame) -> None:
        sender = (frame.role, frame.rank)  # its admission lets a connection speak only as this
        refusal = self.budget.refuse_pull(sender, peer.pending)
        if refusal is not None:
            self.stats.refused_pulls += 1
            raise ProtocolError(refusal)
        peer.pending += 1
        self.budget.pull_waits(sender)
        self._waiting.add(self._group_of(frame), peer, frame, self.monotonic())

    def _group_of(self, frame: Frame) -> GroupKey:
        ranges = self.state.index.touched(frame.keys)
        return frame.rank, ranges.start, ranges.stop

    def _pull_ended(self, pull: Waiting[_Peer]) -> None:
        pull.peer.pending -= 1
        self.budget.pull_ends((pull.frame.role, pull.frame.rank))

    def _push(self, peer: _Peer, frame: Frame, message: bytes | bytearray, *,
              chained: bool = False) -> None:
        if frame.request_id in peer.acked:  # sent again: the first one was applied
            self.stats.resent_pushes += 1
            repeated = peer.acked[frame.request_id]
            if repeated is not None:  # else its ack is on the way, once the chain has it
                self._send(peer, repeated)
            return
        if self._draining:
            self._reply_error(peer, frame.request_id, "shutting_down", "run is stopping")
            return
        if frame.role is not Role.WORKER:
            raise ProtocolError(f"only workers push; this frame comes from a {frame.role.name}")
        timing = PushTiming(from_ns(frame.stamp_ns), from_ns(frame.wait_ns),
                            bool(frame.flags & FLAG_FINAL))
        try:
            accepted_at = self.state.push(frame.rank, frame.clock, frame.keys, frame.values,
                                          timing, index=frame.index,
                                          commit=bool(frame.flags & FLAG_COMMIT),
                                          base_version=frame.version, trusted=chained)
        except ShardFull as exc:
            if self.on_full is not None:
                self.on_full(str(exc))
            raise
        ack = self._ack(frame, accepted_at, self.state.last_scale)
        if len(peer.acked) >= REMEMBERED_ACKS:
            peer.acked.popitem(last=False)
        if self.link is None:
            peer.acked[frame.request_id] = ack
            self._send(peer, ack)
        else:  # acknowledged once the chain's tail has applied it too
            peer.acked[frame.request_id] = None
            self.link.forward(message).add_done_callback(
                lambda _: self._acknowledge(peer, frame.request_id, ack))
        self.settle()

    def settle(self) -> None:
        """After the shard's state moved: start its controller's deferred decision, if any,
        report barrier decisions, and answer the pulls that may be answered now."""
        self._start_decision()
        self._report_syncs()
        self.release_ready_pulls()

    def _report_syncs(self) -> None:
        syncs = self.state.controller.take_syncs()
        if syncs and self._on_syncs is not None:
            self._on_syncs(syncs)

    def _start_decision(self) -> None:
        """Run the controller's deferred decision, if it has one, on a thread: the workers it
        concerns wait at their barriers meanwhile, and the loop serves everyone else."""
        deferred = self.state.controller.take_deferred()
        if deferred is None:
            return
        task = asyncio.get_running_loop().create_task(self._decide(deferred, self.state))
        self._decisions.add(task)
        task.add_done_callback(self._decisions.discard)

    async def _decide(self, deferred: Deferred[Any], state: ShardState) -> None:
        try:
            result = await off_loop(deferred.run)
        except Exception as exc:  # a bug: fail the waiting pulls loudly, never leave them hung
            log.exception("a barrier decision failed")
            self.drain(f"a barrier decision failed: {exc}")
            return
        if state is not self.state:  # the copy was replaced meanwhile; its controller is gone
            return
        deferred.finish(result)
        self._report_syncs()
        self.release_ready_pulls()

    def _acknowledge(self, peer: _Peer, request_id: int, ack: Frame) -> None:
        if request_id in peer.acked:
            peer.acked[request_id] = ack
        self._send(peer, ack)

    def demote(self) -> None:
        """This copy stops serving workers (they are answered ``not_primary``); its chain
        keeps forwarding what it applied."""
        self.primary = False

    async def release_clients(self, reason: str) -> int:
        """Close every connection but the chain predecessor's: workers move to the primary
        they were told of. Returns how many were closed."""
        clients = [peer for peer in self._peers if not _chained(peer.connection)]
        for peer in clients:
            self._abandon(peer, reason)
        await asyncio.gather(*(peer.connection.close(CLOSE_MOVED, reason)
                               for peer in clients), return_exceptions=True)
        return len(clients)

    def promote(self) -> None:
        """This backup becomes its keys' primary: it serves workers from now on."""
        self.primary = True
        self.promoted_at = time.time()

    def release_ready_pulls(self) -> None:
        """Answer the waiting pulls that may be answered now (after an update, or when the
        job's workers changed)."""
        if not len(self._waiting):
            return
        state = self.state
        now = self.monotonic()
        for pull in self._waiting.release(
                lambda f: state.pull_ready(f.rank, f.clock, f.keys)):
            self._pull_ended(pull)
            self._answer_pull(pull.peer, pull.frame, waited_s=now - pull.since)

    def _answer_pull(self, peer: _Peer, frame: Frame, *, waited_s: float) -> None:
        # Answered in the type the pull asked for and, for a key list, packed as it came.
        if frame.role is Role.WORKER and peer.puller != frame.rank:
            self.pull_filter.forget(frame.rank)
            peer.puller = frame.rank
        index, values = self._pulled(frame)
        values = narrow(values, numpy_dtype(frame.dtype))
        reply = Frame(
            MsgType.VALUES,
            frame.request_id,
            frame.keys,
            run=self.run,
            role=Role.SERVER,
            rank=self.rank,
            clock=self.state.slowest_clock(frame.keys),
            version=self.state.version_of(frame.keys),
            wait_ns=int(waited_s * 1e9),
            dtype=frame.dtype,
            payload=values,
            index=index,
            codec=frame.codec if index is not None else Codec.NONE,
        )
        self._send(peer, reply)
        if self.promoted_at is not None and self.first_pull_at is None:
            self.first_pull_at = time.time()
            if self.on_first_pull is not None:
                self.on_first_pull(self)

    def _pulled(self, frame: Frame) -> tuple[np.ndarray | None, np.ndarray]:
        """(keys, values) of a pull's answer: those asked for, or for a worker's pull, those
        the pull filter lets through (then as a key list)."""
        if frame.role is not Role.WORKER:
            return frame.index, self.state.read(frame.keys, frame.index)
        if frame.index is not None:
            rows, values = self.state.read_keyed(frame.keys, frame.index)
            kept = self.pull_filter.select_rows(frame.rank, rows, values)
            return (frame.index, values) if kept is None else (frame.index[kept], values[kept])
        values = self.state.read(frame.keys, None)
        span = self.state.keys.local(frame.keys)
        chosen = self.pull_filter.select(frame.rank, span, values)
        if chosen is None:
            return None, values
        keys = (chosen + self.state.keys.start).astype(
            np.uint32 if self.state.keys.end <= 2**32 else np.uint64)
        return keys, values[chosen - span.start]

    def _clocks(self, frame: Frame) -> Frame:
        """The next clock this shard expects from the asking worker on the span (its slowest
        clock range): where a restarted worker rejoins."""
        if frame.role is not Role.WORKER:
            raise ProtocolError("only workers ask for their clocks")
        ack = self._ack(frame, self.state.version_of(frame.keys))
        return replace(ack, clock=self.state.worker_clock(frame.rank, frame.keys))

    def _ack(self, frame: Frame, version: int, scale: float | None = None) -> Frame:
        return Frame(
            MsgType.ACK,
            frame.request_id,
            frame.keys,
            run=self.run,
            role=Role.SERVER,
            rank=self.rank,
            clock=frame.clock,
            version=version,
            dtype=DType.FLOAT64 if scale is not None else DType.FLOAT32,
            payload=None if scale is None else np.array([scale], dtype=np.float64),
        )

    def _refuse(self, peer: _Peer, request_id: int, exc: PsctlError) -> None:
        self.stats.bad_frames += 1
        code = type(exc).__name__
        self.stats.errors_by_code[code] = self.stats.errors_by_code.get(code, 0) + 1
        held_back = peer.log.take()
        if held_back is None:
            self.stats.warnings_held_back += 1
        else:
            more = f" ({held_back} more refusals were not logged)" if held_back else ""
            log.warning("refused a frame from %s: %s%s", peer.connection.remote, exc, more)
        self._reply_error(peer, request_id, code, str(exc))

    def _reply_error(self, peer: _Peer, request_id: int, code: str, message: str) -> None:
        self._send(peer, error_frame(request_id, code, message, role=Role.SERVER, rank=self.rank))

    def _send(self, peer: _Peer, frame: Frame) -> None:
        # Encoding copies the payload now, so the reply is a snapshot of this version even if
        # the parameters change before the bytes leave; each peer's own task sends, so one
        # slow peer never delays the replies to the others.
        if peer.closing is not None:
            return
        data = encode(frame)
        limit = self.limits.max_queued_bytes
        if peer.queue and peer.queued_bytes + peer.unsent_bytes() + len(data) > limit:
            self._too_slow(peer, f"reading too slowly: over {limit} reply bytes unread "
                                 "(cluster.max_queued_bytes)")
            return
        if not self._make_room(peer, len(data)):
            return
        self.stats.bytes_out += len(data)
        if self._made is not None:
            self._made(len(data))
        peer.enqueue(data, frame.type is MsgType.VALUES)

    def _make_room(self, peer: _Peer, size: int) -> bool:
        """Disconnect the slowest readers of the process until ``size`` more reply bytes fit
        its budget (a reply to a connection with nothing queued always fits); False if
        ``peer`` itself was the one to go."""
        budget = self.budget
        while budget.over(size):
            victim = budget.slowest(peer, self.monotonic())
            if not isinstance(victim, _Peer):
                return True
            victim.owner._too_slow(victim, (
                f"reading too slowly: the server's {budget.limits.max_server_queued_bytes} "
                "bytes of unread replies are full and this connection held more than its "
                "share, or waited longest (cluster.max_server_queued_bytes)"))
            if victim is peer:
                return False
        return True

    def _too_slow(self, peer: _Peer, reason: str) -> None:
        self.stats.slow_readers_closed += 1
        log.warning("%s reads too slowly: %d reply bytes unread; disconnecting",
                    peer.connection.remote, peer.queued_bytes)
        self._abandon(peer, reason)
        peer.close = asyncio.create_task(peer.connection.close(CLOSE_POLICY, reason))
        # Its transport's buffers are freed when the connection is gone, seconds later maybe.
        peer.close.add_done_callback(lambda _: self.budget.release_memory())

    async def _pump(self, peer: _Peer) -> None:
        """Send ``peer``'s queue in order, one frame at a time (websockets applies backpressure
        to each send, so at most one frame beyond the queue sits in the socket's buffer)."""
        with contextlib.suppress(ConnectionClosed):
            while True:
                while peer.queue:
                    await peer.connection.send(peer.queue[0])
                    if peer.queue:  # a disconnect may have emptied it meanwhile
                        peer.sent()
                peer.wake.clear()
                await peer.wake.wait()

    async def _flush(self, peer: _Peer, *, timeout: float) -> None:
        deadline = self.monotonic() + timeout
        while peer.queue and self.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def _disconnect(self, peer: _Peer, reason: str) -> None:
        if self._abandon(peer, reason):
            await peer.connection.close(CLOSE_POLICY, reason)

    def _abandon(self, peer: _Peer, reason: str) -> bool:
        """Stop serving ``peer`` at once (its queued replies are dropped); False if already."""
        if peer.closing is not None:
            return False
        peer.closing = reason
        peer.drop_queue()
        self._let_go(peer)
        peer.stop_sending()
        return True

    def _let_go(self, peer: _Peer) -> None:
        """``peer`` is served no more; what its transport still holds counts until it is sent
        or the connection is gone."""
        self.budget.readers.discard(peer)
        self.budget.closing.add(peer.connection)


def _chained(connection: Connection) -> bool:
    """Admitted as a server: a chain predecessor, which forwards every worker's updates."""
    admission = connection.admission
    return admission is not None and admission.role == "server"
