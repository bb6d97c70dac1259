"""The coordinator, in one process, facing what must not end a run: bad hellos of every kind, an
evaluator that dies and comes back; and what must end it at once: a role the launcher says will
not come back, a role that crashed and said why."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from engine.config import RunConfig
from engine.errors import ConnectionClosed
from engine.plan import build_config
from engine.roles.coordination import Coordinator
from engine.roles.coordinator import model_layout
from engine.transport import MemoryTransport
from engine.transport.admission import credential
from engine.transport.base import Connection
from engine.transport.control import fatal
from engine.wire.messages import (
    Attach,
    Attached,
    Evaluate,
    Exit,
    Fatal,
    Hello,
    Joined,
    Message,
    RoleEnded,
    Scale,
    ScaleAnswer,
    Serving,
    ShardInfo,
    Welcome,
    dump_control,
    parse_control,
)
from engine.wire.records import EventRecord, RunStatus

pytestmark = pytest.mark.timeout(60)
TOKEN = "role-failures-test-token"


def config(**values: Any) -> RunConfig:
    return build_config({}, {"data.dataset": "digits", "cluster.workers": 2,
                             "cluster.servers": 1, **values})


class Events:
    """A recorder that keeps the events and nothing else."""

    def __init__(self) -> None:
        self.events: list[EventRecord] = []

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e.detail for e in self.events if e.kind == kind]

    def record_iterations(self, rows: Any) -> None: ...

    def record_evaluation(self, row: Any) -> None: ...

    def record_event(self, row: EventRecord) -> None:
        self.events.append(row)

    def record_sync(self, row: Any) -> None: ...

    def record_process_samples(self, rows: Any) -> None: ...

    def record_layers(self, rows: Any) -> None: ...


Scenario = Callable[[Coordinator, "Roles", Events], Awaitable[None]]


class Roles:
    """Connections to an in-process coordinator, as roles and as strangers open them."""

    def __init__(self, transport: MemoryTransport, address: str) -> None:
        self.transport, self.address = transport, address

    async def connect(self, token: str = TOKEN) -> Connection:
        return await self.transport.connect(self.address, token=token, timeout=5)

    async def hello(self, role: str, rank: int, token: str = TOKEN) -> Connection:
        connection = await self.connect(token)
        await connection.send(dump_control(Hello(role=role, rank=rank, pid=rank + 100)))
        return connection

    async def attach(self, client: str = "launcher", token: str = TOKEN) -> Connection:
        """The launcher (or psctl scale), attached: the coordinator answers with the run."""
        connection = await self.connect(token)
        await connection.send(dump_control(Attach.model_validate({"client": client, "pid": 1})))
        assert isinstance(await next_message(connection), Attached)
        return connection

    async def joined(self, role: str, rank: int, token: str = TOKEN) -> Connection:
        """A role that said hello and read its welcome."""
        connection = await self.hello(role, rank, token)
        assert isinstance(await next_message(connection), Welcome)
        return connection


async def serving(coordinator: Coordinator, roles: Roles) -> Connection:
    """Server 0, joined and serving every range: workers and the evaluator are welcome."""
    server = await roles.joined("server", 0)
    copies = [ShardInfo(index=index, address=f"memory://shard-{index}", start=keys.start,
                        end=keys.end) for index, keys in enumerate(coordinator.ranges)]
    await server.send(dump_control(Serving(copies=copies)))
    await until(coordinator.servers_ready.is_set, "the servers to be ready")
    return server


async def next_message(connection: Connection) -> Message:
    return parse_control(await asyncio.wait_for(connection.recv(), 5))


async def refused(connection: Connection) -> str:
    """The reason the coordinator closed ``connection`` with (it sends nothing before)."""
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(connection.recv(), 5)
    return str(closed.value)


def run_scenario(run: RunConfig, scenario: Scenario, *, folder: Path | None = None,
                 ) -> tuple[Events, tuple[RunStatus, str | None] | None]:
    """Run ``scenario`` against a started coordinator; the run's outcome if it ended by
    itself (else it is interrupted afterwards)."""
    sink = Events()

    async def main() -> tuple[RunStatus, str | None] | None:
        transport = MemoryTransport()
        coordinator = Coordinator(run, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(run), recorder=sink, folder=folder)
        address = await coordinator.start(transport, "coordinator", 0)
        ending = asyncio.create_task(coordinator.run())
        await scenario(coordinator, Roles(transport, address), sink)
        outcome = coordinator.outcome.result() if coordinator.outcome.done() else None
        coordinator.interrupt()
        await asyncio.wait_for(ending, 10)
        await coordinator.close()
        return outcome

    return sink, asyncio.run(main())


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# -- bad hellos -----------------------------------------------------------------------------------


def test_every_bad_hello_is_refused_and_recorded_and_the_run_goes_on() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        server = await roles.joined("server", 0)
        worker = await roles.hello("worker", 0, credential(TOKEN, "worker", 0))
        await until(lambda: ("worker", 0) in coordinator.peers, "worker 0 to register")
        reasons = {}
        # the run's secret saying hello as a process that is there already
        reasons["duplicate"] = await refused(await roles.hello("server", 0))
        # worker 0's own credential, again, while worker 0 is alive
        reasons["again"] = await refused(
            await roles.hello("worker", 0, credential(TOKEN, "worker", 0)))
        reasons["rank"] = await refused(await roles.hello("worker", 99))
        reasons["other rank"] = await refused(
            await roles.hello("worker", 1, credential(TOKEN, "worker", 0)))
        garbage = await roles.connect()
        await garbage.send(b"\x00{not json")
        reasons["garbage"] = await refused(garbage)
        first = await roles.connect()
        await first.send(dump_control(Exit()))
        reasons["not a hello"] = await refused(first)
        reasons["silent"] = await refused(await roles.connect())
        assert not coordinator.outcome.done(), coordinator.outcome.result()
        assert "server 0 joined twice" in reasons["duplicate"]
        assert "worker 0 joined twice" in reasons["again"]
        assert "worker rank 99 is outside 0..1" in reasons["rank"]
        assert "it said hello as worker 1" in reasons["other rank"]
        assert "expected hello, got exit" in reasons["not a hello"]
        assert "no hello within 0.5 s of connecting" in reasons["silent"]
        # the roles that were there are undisturbed
        assert coordinator.peers[("server", 0)].connection is not None
        assert not coordinator.peers[("worker", 0)].lost
        del server, worker

    sink, outcome = run_scenario(config(**{"cluster.connect_timeout_s": 0.5}), scenario)
    assert outcome is None  # nothing ended the run
    refusals = sink.of("hello_refused")
    assert len(refusals) == 7
    assert [r["refused"] for r in refusals] == list(range(1, 8))
    assert all(r["remote"] and r["reason"] for r in refusals)
    assert "run_failed" not in [e.kind for e in sink.events]


def test_a_flood_of_bad_hellos_is_recorded_only_so_far() -> None:
    from engine.roles import coordination

    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        for _ in range(coordination.REFUSALS_RECORDED + 5):
            await refused(await roles.hello("worker", 99))
        assert coordinator._refused == coordination.REFUSALS_RECORDED + 5
        assert not coordinator.outcome.done()

    sink, _ = run_scenario(config(), scenario)
    assert len(sink.of("hello_refused")) == coordination.REFUSALS_RECORDED


# -- the evaluator --------------------------------------------------------------------------------


def test_a_lost_evaluator_is_waited_for_and_asked_again_when_it_rejoins() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        await serving(coordinator, roles)
        evaluator = await roles.joined("evaluator", 0)
        coordinator.evaluations.request(0.5, final=False)
        assert isinstance(await next_message(evaluator), Evaluate)
        await evaluator.close()  # killed before it answered
        await until(lambda: coordinator.peers[("evaluator", 0)].lost, "the evaluator's loss")
        # the final evaluation is asked for while there is no evaluator: it is not lost
        waiting = asyncio.ensure_future(coordinator.evaluations.final())
        await asyncio.sleep(0)
        again = await roles.joined("evaluator", 0)
        asked = await next_message(again)
        assert isinstance(asked, Evaluate) and asked.final
        assert not coordinator.outcome.done()
        # answered or not, the timer's evaluations go on with the new evaluator
        assert coordinator.evaluations.final_asked == 1
        waiting.cancel()

    sink, outcome = run_scenario(config(), scenario)
    assert outcome is None
    assert sink.of("evaluator_lost") == [{"rank": 0, "pid": 100, "restart": 1,
                                          "max_restarts": 3}]
    assert [e["pid"] for e in sink.of("evaluator_rejoined")] == [100]


def test_an_evaluator_lost_more_often_than_it_may_be_restarted_ends_the_run() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        await serving(coordinator, roles)
        evaluator = await roles.joined("evaluator", 0)
        await evaluator.close()
        await until(lambda: coordinator.outcome.done(), "the run to end")

    _, outcome = run_scenario(config(**{"fault.max_restarts": 0}), scenario)
    assert outcome is not None and outcome[0] is RunStatus.FAILED
    assert outcome[1] is not None and outcome[1].startswith(
        "evaluator 0 disconnected unexpectedly")
    assert "restarted 0 times already (fault.max_restarts = 0)" in outcome[1]


# -- roles that will not come back ----------------------------------------------------------------


def test_a_worker_the_launcher_says_exited_with_an_error_ends_the_run_at_once() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        launcher = await roles.attach()
        await serving(coordinator, roles)
        worker = await roles.joined("worker", 1)
        await worker.close()
        await until(lambda: coordinator.peers[("worker", 1)].lost, "the worker's loss")
        assert not coordinator.outcome.done()  # it may be restarted: it is waited for
        await launcher.send(dump_control(RoleEnded(
            role="worker", rank=1, why="exited with code 1: ValueError: NaN in x")))
        await until(lambda: coordinator.outcome.done(), "the run to end", timeout=3)

    _, outcome = run_scenario(config(), scenario)
    assert outcome == (RunStatus.FAILED, "worker 1 exited with code 1: ValueError: NaN in x")


def test_the_launchers_word_before_the_loss_ends_the_run_at_the_loss() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        launcher = await roles.attach()
        await serving(coordinator, roles)
        worker = await roles.joined("worker", 1)
        await launcher.send(dump_control(RoleEnded(role="worker", rank=1,
                                                   why="exited with code 2: bad file")))
        await asyncio.sleep(0.1)
        assert not coordinator.outcome.done()  # it still runs, as far as the run knows
        await worker.close()
        await until(lambda: coordinator.outcome.done(), "the run to end", timeout=3)

    _, outcome = run_scenario(config(), scenario)
    assert outcome == (RunStatus.FAILED, "worker 1 exited with code 2: bad file")


def test_the_launcher_is_told_each_join() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        launcher = await roles.attach()
        await serving(coordinator, roles)
        await roles.joined("worker", 0)
        counts = [await next_message(launcher) for _ in range(2)]
        assert counts == [Joined(count=1), Joined(count=2)]

    run_scenario(config(), scenario)


@pytest.mark.parametrize(("client", "says"), [
    ("launcher", "a launcher is attached to this run already"),
    ("scale", "the scale may not send role_ended"),
])
def test_a_party_is_refused_what_it_may_not_do(client: str, says: str) -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        await roles.attach()
        if client == "launcher":
            second = await roles.connect()
            await second.send(dump_control(Attach(client="launcher", pid=2)))
        else:
            second = await roles.attach("scale")
            await second.send(dump_control(RoleEnded(role="worker", rank=0, why="no")))
        assert says in await refused(second)

    _, outcome = run_scenario(config(), scenario)
    assert outcome is None  # the run goes on


def test_only_the_runs_secret_or_the_scale_credential_attaches() -> None:
    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        worker = await roles.connect(credential(TOKEN, "worker", 0))
        await worker.send(dump_control(Attach(client="launcher", pid=3)))
        assert "admitted as worker 0, it said hello as launcher 0" in await refused(worker)
        scale = await roles.attach("scale", credential(TOKEN, "scale", 0))
        await scale.send(dump_control(Scale(role="workers", count=3)))
        answer = await next_message(scale)
        # before training, and bsp cannot change its workers anyway: refused, in words
        assert isinstance(answer, ScaleAnswer) and answer.kind == "scale_refused"
        assert "once training has started" in str(answer.detail["reason"])

    sink, outcome = run_scenario(config(), scenario)
    assert outcome is None
    assert [e["reason"] for e in sink.of("scale_refused")] == [
        "the job takes psctl scale once training has started; ask again then"]


def test_a_flood_of_refused_scale_requests_is_answered_but_recorded_only_so_far() -> None:
    """Issue 57: 20,000 refused requests wrote 19,927 event rows. Each is answered; the first
    REFUSALS_RECORDED are recorded, with the count so far, and the rest counted."""
    requests = 20_000
    counted: list[int] = []

    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        scale = await roles.attach("scale", credential(TOKEN, "scale", 0))
        await scale.send(dump_control(Scale(role="workers", count=3)))
        answer = await next_message(scale)  # over the wire, as psctl scale asks
        assert isinstance(answer, ScaleAnswer) and answer.kind == "scale_refused"
        for _ in range(requests - 1):  # the same part, without 20,000 round trips
            kind, _ = coordinator.scaling.request("workers", 3)
            assert kind == "scale_refused"
        counted.append(getattr(coordinator.scaling, "refused", 0))

    sink, outcome = run_scenario(config(), scenario)
    assert outcome is None
    recorded = sink.of("scale_refused")
    assert len(recorded) == 100  # as many as refused hellos
    assert [r["refused"] for r in recorded] == list(range(1, 101))
    assert counted == [requests]


def test_a_crash_in_user_code_fails_the_run_with_its_message() -> None:
    def forward() -> None:
        raise RuntimeError("boom")

    try:
        forward()
    except RuntimeError as exc:
        report = fatal(exc)
    assert report.message.startswith("RuntimeError: boom (in forward, test_role_failures.py "
                                     "line ")
    assert report.traceback.rstrip().endswith("RuntimeError: boom")

    async def scenario(coordinator: Coordinator, roles: Roles, sink: Events) -> None:
        await serving(coordinator, roles)
        worker = await roles.joined("worker", 1)
        await worker.send(dump_control(report))
        await until(lambda: coordinator.outcome.done(), "the run to end")
        # it then exits: the run ended already, so its loss changes nothing
        await worker.send(dump_control(Fatal(message="later")))
        await worker.close()

    sink, outcome = run_scenario(config(), scenario)
    assert outcome is not None and outcome[0] is RunStatus.FAILED
    assert outcome[1] == f"worker 1 failed: {report.message}"
    assert [e["message"] for e in sink.of("process_error")] == [report.message, "later"]
    assert len(sink.of("run_failed")) == 1
