"""The coordinator's own decisions, in one process: its join deadline, and how a run ends when
the recorder fails or when no worker completed an iteration."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.config import RunConfig
from engine.errors import ConnectionClosed, StoreError
from engine.plan import build_config
from engine.roles.coordination import Coordinator
from engine.roles.coordinator import model_layout
from engine.roles.joining import JOIN_S_PER_PROCESS, join_deadline_s, join_failure
from engine.transport import MemoryTransport
from engine.wire.messages import Hello, Welcome, dump_control, parse_control
from engine.wire.records import RunStatus

pytestmark = pytest.mark.timeout(60)
TOKEN = "coordination-test-token"


def config(**values: Any) -> RunConfig:
    return build_config({}, {"data.dataset": "digits", **values})


@dataclass
class BrokenSink:
    """A recorder whose writer has failed: every call raises, as ``Recorder``'s do then."""

    calls: list[str] = field(default_factory=list)

    def _fail(self, what: str) -> None:
        self.calls.append(what)
        raise StoreError("the recorder could not write x.db: FOREIGN KEY constraint failed")

    def record_iterations(self, rows: Any) -> None:
        self._fail("iterations")

    def record_evaluation(self, row: Any) -> None:
        self._fail("evaluation")

    def record_event(self, row: Any) -> None:
        self._fail("event")

    def record_sync(self, row: Any) -> None:
        self._fail("sync")


class QuietSink:
    """A recorder that works and keeps nothing."""

    def record_iterations(self, rows: Any) -> None: ...

    def record_evaluation(self, row: Any) -> None: ...

    def record_event(self, row: Any) -> None: ...

    def record_sync(self, row: Any) -> None: ...


def test_the_join_deadline_grows_with_the_processes_to_start() -> None:
    small = config(**{"cluster.workers": 2, "cluster.servers": 1})
    large = config(**{"cluster.workers": 100, "cluster.servers": 2})
    assert join_deadline_s(small) == 60.0 + JOIN_S_PER_PROCESS * 4
    assert join_deadline_s(large) == 60.0 + JOIN_S_PER_PROCESS * 103
    slow = config(**{"cluster.workers": 100, "cluster.servers": 2,
                     "cluster.connect_timeout_s": 600.0})
    assert join_deadline_s(slow) - join_deadline_s(large) == 540.0


def test_a_join_failure_says_who_is_missing_and_which_setting_to_raise() -> None:
    large = config(**{"cluster.workers": 100, "cluster.servers": 2})
    missing = [f"worker {rank}" for rank in range(40, 100)]
    message = join_failure(missing, large)
    assert message.startswith("60 of 103 processes (worker 40, worker 41, ")
    assert "worker 47 and 52 more) did not join within 369 s" in message
    assert "raise cluster.connect_timeout_s" in message
    assert "worker 48" not in message


def test_a_failing_recorder_ends_the_run_instead_of_hanging_it() -> None:
    run = config(**{"cluster.workers": 2, "cluster.servers": 1})
    sink = BrokenSink()

    async def scenario() -> tuple[RunStatus, str | None]:
        transport = MemoryTransport()
        coordinator = Coordinator(run, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(run), recorder=sink)
        address = await coordinator.start(transport, "coordinator", 0)
        ending = asyncio.create_task(coordinator.run())
        # A server joins: its process_joined event is the first write, and it fails.
        connection = await transport.connect(address, token=TOKEN, timeout=5)
        await connection.send(dump_control(Hello(role="server", rank=0, pid=1)))
        return await asyncio.wait_for(ending, 5)

    status, reason = asyncio.run(scenario())
    assert status is RunStatus.FAILED
    assert reason == "the recorder could not write x.db: FOREIGN KEY constraint failed"
    assert sink.calls[0] == "event"


def test_fail_settles_the_run_even_when_it_cannot_be_recorded() -> None:
    run = config(**{"cluster.workers": 2, "cluster.servers": 1})

    async def scenario() -> tuple[RunStatus, str | None]:
        coordinator = Coordinator(run, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(run), recorder=BrokenSink())
        coordinator.fail("worker 1 failed: out of memory")
        return await asyncio.wait_for(coordinator.outcome, 1)

    assert asyncio.run(scenario()) == (RunStatus.FAILED, "worker 1 failed: out of memory")


def test_roles_wait_for_their_peers_as_long_as_the_run_lets_them_join() -> None:
    large = config(**{"cluster.workers": 100, "cluster.servers": 2})

    async def welcome_config() -> dict[str, Any]:
        transport = MemoryTransport()
        coordinator = Coordinator(large, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(large), recorder=QuietSink())
        address = await coordinator.start(transport, "coordinator", 0)
        connection = await transport.connect(address, token=TOKEN, timeout=5)
        await connection.send(dump_control(Hello(role="server", rank=0, pid=1)))
        welcome = parse_control(await asyncio.wait_for(connection.recv(), 5))
        coordinator.interrupt()
        await asyncio.wait_for(coordinator.run(), 5)
        assert isinstance(welcome, Welcome)
        return welcome.config

    sent = asyncio.run(welcome_config())
    # the first worker to start waits for the start of training until the last one has joined
    assert sent["cluster"]["connect_timeout_s"] == join_deadline_s(large)
    assert large.cluster.connect_timeout_s == 60.0  # the run's own config is left as set


def test_a_worker_joining_as_the_run_fails_is_let_go_with_the_run_not_at_the_deadline() -> None:
    """No server listens yet, so a worker's welcome waits; the run fails meanwhile (a server's
    checkpoint refused, say): the worker is closed with the reason, and the coordinator ends
    at once instead of holding its connection until the join deadline (72 s here)."""
    run = config(**{"cluster.workers": 2, "cluster.servers": 1})
    events: list[str] = []

    class Events(QuietSink):
        def record_event(self, row: Any) -> None:
            events.append(row.kind)

    async def scenario() -> tuple[RunStatus, str | None, int | None, str]:
        transport = MemoryTransport()
        coordinator = Coordinator(run, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(run), recorder=Events())
        address = await coordinator.start(transport, "coordinator", 0)
        ending = asyncio.create_task(coordinator.run())
        connection = await transport.connect(address, token=TOKEN, timeout=5)
        await connection.send(dump_control(Hello(role="worker", rank=0, pid=1)))
        while "process_joined" not in events:
            await asyncio.sleep(0.01)
        coordinator.fail("server 0 failed: checkpoint 1 holds values that are not finite")
        status, reason = await asyncio.wait_for(ending, 5)
        with pytest.raises(ConnectionClosed) as closed:
            while True:  # an Exit may come first; then the close
                await asyncio.wait_for(connection.recv(), 5)
        return status, reason, closed.value.code, str(closed.value)

    status, reason, code, why = asyncio.run(scenario())
    assert (status, reason) == (RunStatus.FAILED, "server 0 failed: checkpoint 1 holds values "
                                                  "that are not finite")
    assert code == 1008 and "the run ended before the shard servers listened" in why
    assert events.count("run_failed") == 1  # its own reason, once


def test_a_run_stopped_before_any_iteration_fails_and_says_why() -> None:
    # A time limit that passes before any worker joins: each is told to stop as it joins.
    from tests.engine.test_cluster_memory import run_cluster

    outcome = run_cluster({"cluster.workers": 2, "cluster.servers": 1,
                           "stop.max_seconds": 0.001})
    assert outcome.status is RunStatus.FAILED
    assert outcome.reason == ("no worker completed an iteration before the run stopped (time "
                              "limit of 0.001 s reached)")
    assert outcome.worker_iterations == {0: 0, 1: 0}
    assert outcome.sink.iterations == []


def test_a_diverged_model_fails_the_run_and_records_no_nan() -> None:
    from engine.wire.messages import Evaluation
    from engine.wire.records import EvaluationRecord

    run = config(**{"cluster.workers": 2, "cluster.servers": 1})
    kept: list[Any] = []

    class Keeping(QuietSink):
        def record_evaluation(self, row: Any) -> None:
            kept.append(row)

    async def scenario() -> tuple[RunStatus, str | None]:
        coordinator = Coordinator(run, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(run), recorder=Keeping())
        row = EvaluationRecord(at=1.0, elapsed_s=1.0, step=40, accuracy=0.1135,
                               loss=float("nan"), epoch=1.5)
        coordinator.evaluations.on_evaluation(Evaluation(row=row, final=False))
        return await asyncio.wait_for(coordinator.outcome, 1)

    status, reason = asyncio.run(scenario())
    assert status is RunStatus.FAILED and kept == []
    assert reason is not None and reason.startswith("the model diverged: the test loss is nan "
                                                    "at step 40 (accuracy 11.35%)")
