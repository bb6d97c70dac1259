"""The coordinator is composed of parts (moves, recovery, scaling, parties, evaluations, records)
that share the run's state and ask the coordinator only what ``Hub`` lists: none reaches
another through the coordinator, and each part's decisions are tested on the part."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from engine.roles import evaluations, moves, parties, recovery, scaling
from engine.roles.coordination import Coordinator
from engine.roles.peer import Hub

PARTS = (moves, recovery, scaling, parties, evaluations)


def _hub_calls(module: object) -> set[str]:
    """The names a part's module reaches through ``self.hub``."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "hub"}


def test_a_part_asks_the_coordinator_only_what_the_hub_lists() -> None:
    listed = {name for name, value in vars(Hub).items()
              if inspect.isfunction(value) and not name.startswith("_")}
    assert listed == {"fail", "stop", "event", "send", "order", "spawn"}
    for module in PARTS:
        assert _hub_calls(module) <= listed, module.__name__
    for name in listed:  # the coordinator is a Hub
        assert callable(getattr(Coordinator, name))


def test_no_part_inherits_from_another_or_from_a_base_of_stubs() -> None:
    for cls in (moves.Moves, recovery.Recovery, scaling.Scaling, parties.Parties,
                evaluations.Evaluations, Coordinator):
        assert cls.__mro__ == (cls, object), cls
        source = inspect.getsource(cls)
        assert "NotImplementedError" not in source, cls


class _Connection:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed = False

    async def send(self, message: str) -> None:
        self.sent.append(message)

    async def close(self, *args: object) -> None:
        self.closed = True


class _Events:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def record_event(self, row: Any) -> None:
        self.kinds.append(row.kind)

    def __getattr__(self, name: str) -> Any:  # the other record_* calls: kept nowhere
        return lambda *args: None


def test_a_silent_server_whose_kill_fails_is_failed_over_at_once_and_only_once() -> None:
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout
    from engine.roles.peer import Peer
    from engine.wire.messages import Chain, Promote, parse_control

    killed: list[int] = []

    def kill(pid: int) -> None:
        killed.append(pid)
        raise ProcessLookupError("no such process")

    async def main() -> None:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 1,
                                   "cluster.servers": 2, "cluster.replicas": 1})
        events = _Events()
        coordinator = Coordinator(config, run_id="f" * 32, token="t",
                                  layout=model_layout(config), recorder=events,
                                  kill=kill)
        silent, backup = _Connection(), _Connection()
        peers = [Peer("server", 0, silent, welcomed=True, pid=4242),  # type: ignore[arg-type]
                 Peer("server", 1, backup, welcomed=True, pid=4343)]  # type: ignore[arg-type]
        coordinator.peers.update({("server", p.rank): p for p in peers})
        coordinator.recovery.fence(peers[0], 0.7, "no heartbeat for 0.70 s")
        coordinator.recovery.fail_over(peers[0])  # its connection closing later changes nothing
        await asyncio.sleep(0.05)
        assert killed == [4242] and peers[0].lost and silent.closed
        assert events.kinds.count("server_lost") == 1
        assert "server_unresponsive" in events.kinds and "failover" in events.kinds
        # Server 1 takes range 0 over, and is the tail of its own range's chain now.
        assert sorted(map(str, (parse_control(m) for m in backup.sent))) == sorted(
            map(str, [Promote(index=0), Chain(index=1, successor=None)]))

    asyncio.run(main())


@pytest.mark.parametrize(("settings", "says"), [
    ({}, None),
    ({"sync.model": "elastic"}, "ElasticBSP places its barriers"),
    ({"sync.model": "asp", "learning.rule": "dynssgc"}, "learning.rule dynssgc keeps"),
])
def test_moves_are_refused_where_a_snapshot_cannot_carry_a_ranges_whole_state(
        settings: dict[str, str], says: str | None, tmp_path: Path) -> None:
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout

    async def refusal() -> str | None:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 2,
                                   "cluster.servers": 2, "cluster.replicas": 1, **settings})
        coordinator = Coordinator(config, run_id="e" * 32, token="t",
                                  layout=model_layout(config), recorder=_Events(),
                                  folder=tmp_path)
        first = coordinator.moves.refusal()
        coordinator.membership.scale_to(3)  # a job whose workers changed cannot move ranges
        if first is None:
            assert "changed its workers" in str(coordinator.moves.refusal())
        return first

    found = asyncio.run(refusal())
    assert (found is None) if says is None else (says in str(found))


def test_without_a_run_folder_nothing_moves() -> None:
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout

    async def refusal() -> str | None:
        config = build_config({}, {"data.dataset": "digits"})
        return Coordinator(config, run_id="e" * 32, token="t",
                           layout=model_layout(config),
                           recorder=_Events()).moves.refusal()

    assert "no folder" in str(asyncio.run(refusal()))


def test_a_silent_server_holding_the_last_copy_is_waited_for_not_fenced() -> None:
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout
    from engine.roles.peer import Peer
    from engine.roles.probe import Look, State

    killed: list[int] = []

    async def main() -> list[str]:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 1,
                                   "cluster.servers": 2, "cluster.replicas": 1})
        events = _Events()
        coordinator = Coordinator(config, run_id="f" * 32, token="t",
                                  layout=model_layout(config), recorder=events,
                                  kill=killed.append)
        part = coordinator.recovery
        part.watch.probe = lambda pid, cpu: Look(State.STOPPED, 0.0)
        survivor = Peer("server", 0, _Connection(), welcomed=True, pid=4242)  # type: ignore[arg-type]
        coordinator.peers[("server", 0)] = survivor
        coordinator.placement.lose(1)  # server 1 died: server 0 holds every range alone
        part.watch.watch(0)
        detector = part.watch.detector
        for tick in range(60):  # 6 s of silence
            detector.tick(tick * detector.interval_s)
        part.judge(survivor)
        part.judge(survivor)  # said once
        return events.kinds

    kinds = asyncio.run(main())
    assert killed == [] and kinds.count("fence_withheld") == 1
    assert "server_unresponsive" not in kinds


def test_no_final_checkpoint_is_tried_once_a_range_has_no_copy_left(tmp_path: Path) -> None:
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout
    from engine.roles.peer import Peer
    from engine.wire.records import RunStatus

    async def wants() -> tuple[bool, bool]:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 1,
                                   "cluster.servers": 2, "cluster.replicas": 1})
        coordinator = Coordinator(config, run_id="f" * 32, token="t",
                                  layout=model_layout(config), recorder=_Events(),
                                  folder=tmp_path)
        coordinator.training.set()
        coordinator.peers.update({("server", r): Peer("server", r, _Connection(),  # type: ignore[arg-type]
                                                      welcomed=True) for r in (0, 1)})
        coordinator.placement.lose(1)
        before = coordinator.recovery.wants_final_checkpoint(RunStatus.FAILED)
        coordinator.placement.lose(0)  # both copies of every range: the run failed
        return before, coordinator.recovery.wants_final_checkpoint(RunStatus.FAILED)

    # one copy left: saved (resumable); none left: not tried (it waited 30 s for nobody)
    assert asyncio.run(wants()) == (True, False)


def test_a_server_that_joined_while_training_is_watched_from_its_first_look() -> None:
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout
    from engine.roles.peer import Peer

    async def main() -> tuple[bool, list[str]]:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 1,
                                   "cluster.servers": 2, "cluster.replicas": 1})
        events = _Events()
        coordinator = Coordinator(config, run_id="f" * 32, token="t",
                                  layout=model_layout(config), recorder=events)
        newcomer = Peer("server", 2, _Connection(), welcomed=True, pid=4444,  # type: ignore[arg-type]
                        newcomer=True)
        coordinator.recovery.judge(newcomer)  # was a KeyError that ended the run (psctl scale)
        coordinator.recovery.judge(newcomer)
        return 2 in coordinator.recovery.watch.detector.arrivals, events.kinds

    watched, kinds = asyncio.run(main())
    assert watched and "server_unresponsive" not in kinds


def test_a_replayed_beat_of_a_servers_earlier_process_is_refused_and_counted() -> None:
    """Issue 57: a restarted server counts its beats from 1 again; one captured beat of its
    earlier process (a higher sequence number) must not be taken for the new one's, else every
    genuine beat after it is dropped as old and the new server is fenced."""
    from engine.plan import build_config
    from engine.roles.coordinator import model_layout
    from engine.roles.peer import Peer
    from engine.wire.beats import Beat

    async def main() -> None:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 1,
                                   "cluster.servers": 2, "cluster.replicas": 1})
        events = _Events()
        coordinator = Coordinator(config, run_id="d" * 32, token="t",
                                  layout=model_layout(config), recorder=events)
        recovery, detector = coordinator.recovery, coordinator.recovery.watch.detector
        first = Peer("server", 0, _Connection(), welcomed=True, pid=1,  # type: ignore[arg-type]
                     incarnation=11)
        coordinator.peers[("server", 0)] = first
        recovery.watch.watch(0)
        for seq in range(1, 51):
            recovery.on_beat(Beat(0, 11, seq, 0.0))
        captured = Beat(0, 11, 50, 0.0)
        # Killed, started again: a new process, watched afresh, with its own incarnation.
        coordinator.peers[("server", 0)] = Peer(
            "server", 0, _Connection(), welcomed=True, pid=2,  # type: ignore[arg-type]
            incarnation=12, rejoined=True)
        recovery.watch.watch(0)
        recovery.on_beat(captured)
        for seq in range(1, 4):
            recovery.on_beat(Beat(0, 12, seq, 0.0))
        recovery.on_beat(captured)
        recovery.on_beat(Beat(1, 99, 7, 0.0))  # no server of that incarnation either
        assert detector.arrivals[0].seq == 3  # every beat of the new process heard
        assert recovery.beats_refused == 3
        assert events.kinds.count("heartbeat_refused") == 3

    asyncio.run(main())


def test_a_flood_of_refused_beats_records_few_rows() -> None:
    from engine.plan import build_config
    from engine.roles import recovery as recovery_module
    from engine.roles.coordinator import model_layout
    from engine.wire.beats import Beat

    async def main() -> None:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 1,
                                   "cluster.servers": 2, "cluster.replicas": 1})
        events = _Events()
        coordinator = Coordinator(config, run_id="c" * 32, token="t",
                                  layout=model_layout(config), recorder=events)
        for seq in range(20_000):
            coordinator.recovery.on_beat(Beat(0, 5, seq, 0.0))  # server 0 never joined
        assert coordinator.recovery.beats_refused == 20_000
        # The first ten, then 16, 32, ..., 16384.
        assert events.kinds.count("heartbeat_refused") == recovery_module.BEATS_RECORDED + 11

    asyncio.run(main())
