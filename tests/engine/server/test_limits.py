"""engine.server.limits: what counts against a server's reply budget and whom it disconnects,
and what its stored sparse keys may take."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from engine.config import ClusterConfig
from engine.server.limits import STALLED_S, ServerBudget, ServerLimits, server_memory

MIB = 2**20


@dataclass(eq=False)
class FakeReader:
    queued_frames: int = 0
    queued_bytes: int = 0
    head_since: float = 0.0
    unsent: int = 0

    def unsent_bytes(self) -> int:
        return self.unsent


def test_held_bytes_count_transport_buffers_also_of_closing_connections_until_empty() -> None:
    budget = ServerBudget(ServerLimits(max_server_queued_bytes=4 * MIB))
    reader, closing = FakeReader(unsent=MIB), FakeReader(unsent=2 * MIB)
    budget.readers.add(reader)
    budget.closing.add(closing)
    budget.queued_bytes = MIB
    assert budget.held_bytes() == 4 * MIB
    assert budget.over(1)
    closing.unsent = 0  # its transport is gone or sent everything: no longer counted
    assert budget.held_bytes() == 2 * MIB
    assert closing not in budget.closing
    assert not budget.over(2 * MIB)


def test_one_fresh_reply_is_never_a_reason_but_one_stalled_reply_is() -> None:
    budget = ServerBudget()
    now = 100.0
    fresh = FakeReader(queued_frames=1, head_since=now - 0.01)
    stalled = FakeReader(queued_frames=1, head_since=now - STALLED_S - 0.01)
    idle = FakeReader(queued_frames=0, head_since=now - 50.0)  # nothing queued: never
    budget.readers.update({fresh, idle})
    assert budget.slowest(idle, now) is None
    assert budget.slowest(fresh, now) is fresh  # its next reply would be its second
    budget.readers.add(stalled)
    assert budget.slowest(idle, now) is stalled


def test_on_a_crowded_machine_one_reply_may_wait_as_long_as_a_core_is_shared() -> None:
    """128 workers, 8 servers and the evaluator on 2 cores: a worker waits for a core as long
    as it reads, so its one reply stalls only after 68.5 s (137 / 2 times STALLED_S), not 1 s
    (all 128 pulled at once at the start and were disconnected)."""
    from engine.config import ClusterConfig

    crowded = ServerLimits.from_cluster(ClusterConfig(workers=128, servers=8), cores=2)
    assert crowded.stalled_s == STALLED_S * 137 / 2
    assert ServerLimits.from_cluster(ClusterConfig(workers=2, servers=1), cores=8).stalled_s \
        == STALLED_S
    budget = ServerBudget(crowded)
    now = 100.0
    waiting = FakeReader(queued_frames=1, head_since=now - 5.0)
    budget.readers.add(waiting)
    assert budget.slowest(FakeReader(), now) is None
    waiting.head_since = now - crowded.stalled_s - 0.01
    assert budget.slowest(FakeReader(), now) is waiting


def test_the_longest_waiting_reader_goes_first() -> None:
    budget = ServerBudget()
    now = 100.0
    behind = FakeReader(queued_frames=3, head_since=now - 0.5)
    older = FakeReader(queued_frames=2, head_since=now - 0.8)
    budget.readers.update({behind, older})
    assert budget.slowest(FakeReader(), now) is older


def test_a_reader_holding_more_than_its_share_goes_before_an_older_one_within_it() -> None:
    """A worker on a busy machine, descheduled with a pull's replies queued, waits longer than
    a client that stopped reading a moment ago but holds most of the budget: the client goes."""
    budget = ServerBudget(ServerLimits(max_server_queued_bytes=32 * MIB))
    now = 100.0
    worker = FakeReader(queued_frames=4, queued_bytes=2 * MIB, head_since=now - 2.0)
    other = FakeReader(queued_frames=0)
    hoarder = FakeReader(queued_frames=30, queued_bytes=29 * MIB, unsent=MIB,
                         head_since=now - 0.1)
    budget.readers.update({worker, other, hoarder})
    assert budget.slowest(other, now) is hoarder
    budget.readers.discard(hoarder)  # gone: among readers within their share, the oldest
    assert budget.slowest(other, now) is worker



def test_a_servers_stored_keys_may_take_a_quarter_of_the_machine_shared_by_the_servers() -> None:
    gib = 2**30
    assert server_memory(ClusterConfig(servers=4), machine_bytes=16 * gib) == gib
    assert server_memory(ClusterConfig(servers=4, server_memory=3 * gib),
                         machine_bytes=16 * gib) == 3 * gib
    assert server_memory(ClusterConfig(servers=1)) == psutil.virtual_memory().total // 4
