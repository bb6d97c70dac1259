"""A whole run in one process over the in-memory transport.

The coordinator and the shard servers run on event-loop threads of their own, each worker and the
evaluator on a plain thread (as the main thread of their process would), all on the first
``TRAIN`` samples of the ``digits`` data set, which needs no network: enough clocks to show each
behaviour, few enough to keep the fast tier fast. The coordinator reports into a sink that keeps
rows in lists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from engine.aio import LoopThread
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.errors import ConnectionClosed
from engine.plan import build_config
from engine.roles.coordination import Coordinator
from engine.roles.coordinator import model_layout
from engine.roles.evaluator import run_evaluator
from engine.roles.server import run_server
from engine.roles.worker import run_worker
from engine.transport import MemoryTransport
from engine.transport.admission import credential
from engine.wire.messages import Hello, dump_control
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    ProcessSample,
    RunStatus,
    SyncRecord,
)

TOKEN = "cluster-test-token"
TRAIN = 384  # of digits' 1438 training samples: 6 batches of 32 per worker of two, 4 of three
CHANCE = 0.1  # ten classes


@dataclass
class Sink:
    """A RecorderSink that only keeps what it is given."""

    iterations: list[IterationRecord] = field(default_factory=list)
    syncs: list[SyncRecord] = field(default_factory=list)
    evaluations: list[EvaluationRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    layers: list[LayerRecord] = field(default_factory=list)
    samples: list[ProcessSample] = field(default_factory=list)

    def record_iterations(self, rows: list[IterationRecord]) -> None:
        self.iterations.extend(rows)

    def record_layers(self, rows: list[LayerRecord]) -> None:
        self.layers.extend(rows)

    def record_evaluation(self, row: EvaluationRecord) -> None:
        self.evaluations.append(row)

    def record_event(self, row: EventRecord) -> None:
        self.events.append(row)

    def record_sync(self, row: SyncRecord) -> None:
        self.syncs.append(row)

    def record_process_samples(self, rows: list[ProcessSample]) -> None:
        self.samples.extend(rows)

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]


@dataclass
class Outcome:
    status: RunStatus
    reason: str | None
    sink: Sink
    config: RunConfig
    seconds: float
    worker_iterations: dict[int, int]


class RoleThread(threading.Thread):
    """Runs one role function and keeps its result or exception for the test to check."""

    def __init__(self, name: str, target: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc


@pytest.fixture(scope="module", autouse=True)
def digits_loaded() -> None:
    """Import scikit-learn once, so that no worker thread starts seconds after the others."""
    load_dataset("digits")


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_cluster(overrides: dict[str, Any], *, timeout: float = 60.0) -> Outcome:
    config = build_config(
        {},
        {
            "data.dataset": "digits",
            "cluster.request_timeout_s": 30.0,
            "cluster.connect_timeout_s": 30.0,
            "eval.interval_s": 600.0,
            "data.train_limit": TRAIN,
            **overrides,
        },
    )
    sink = Sink()
    transport = MemoryTransport()
    control_loop, server_loop = LoopThread("test-coordinator"), LoopThread("test-servers")
    threads: list[RoleThread] = []
    servers: list[concurrent.futures.Future[None]] = []
    started = time.perf_counter()
    try:

        async def make() -> tuple[Coordinator, str]:
            coordinator = Coordinator(
                config,
                run_id=uuid.uuid4().hex,
                token=TOKEN,
                layout=model_layout(config),
                recorder=sink,
            )
            return coordinator, await coordinator.start(transport, "coordinator", 0)

        coordinator, address = control_loop.call(make(), 10)
        finished = control_loop.submit(coordinator.run())
        servers = [
            server_loop.submit(run_server(transport, address, rank, token=TOKEN))
            for rank in range(config.cluster.servers)
        ]
        threads = [
            RoleThread(
                f"worker-{rank}",
                functools.partial(run_worker, transport, address, rank,
                                  token=credential(TOKEN, "worker", rank)),
            )
            for rank in range(config.cluster.workers)
        ]
        threads.append(
            RoleThread("evaluator", lambda: run_evaluator(
                transport, address, token=credential(TOKEN, "evaluator", 0)))
        )
        for thread in threads:
            thread.start()
        try:
            status, reason = finished.result(timeout)
        except concurrent.futures.TimeoutError:
            control_loop.loop.call_soon_threadsafe(coordinator.interrupt)
            status, reason = finished.result(10)
            pytest.fail(f"the run did not end within {timeout} s; events: {sink.kinds()}")
        seconds = time.perf_counter() - started
        for thread in threads:
            thread.join(20)
            assert not thread.is_alive(), f"{thread.name} did not exit"
            assert thread.error is None, f"{thread.name} failed: {thread.error!r}"
        for server in servers:
            assert server.result(20) is None
        return Outcome(
            status,
            reason,
            sink,
            config,
            seconds,
            {rank: threads[rank].result for rank in range(config.cluster.workers)},
        )
    finally:
        for server in servers:
            server.cancel()
        for loop_thread in (server_loop, control_loop):
            loop_thread.stop()
            if not loop_thread.loop.is_running():
                loop_thread.loop.close()


def learned(outcome: Outcome) -> None:
    """The final model beats guessing by a wide margin: what a broken update rule, a lost push
    or a garbled pull would not reach. A floor, not a benchmark: how well each policy learns is
    measured in bench/."""
    final = outcome.sink.evaluations[-1]
    print(f"accuracy {final.accuracy:.3f} after step {final.step}")
    assert final.accuracy > 3 * CHANCE, final


def iterations_per_epoch(workers: int, batch_size: int) -> int:
    per_worker = TRAIN // workers
    return -(-per_worker // batch_size)


@pytest.mark.timeout(120)
def test_bsp_run_over_memory() -> None:
    outcome = run_cluster(
        {
            "cluster.workers": 2,
            "cluster.servers": 2,
            "train.epochs": 3,
            "train.batch_size": 32,
            "sync.model": "bsp",
            "model.hidden": [64],
        }
    )
    sink, config = outcome.sink, outcome.config
    print(f"bsp run: {outcome.seconds:.2f} s")
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason

    ipe = iterations_per_epoch(2, 32)
    assert ipe == 6
    per_worker = config.train.epochs * ipe
    assert outcome.worker_iterations == {0: per_worker, 1: per_worker}
    rows = sink.iterations
    assert len(rows) == 2 * per_worker
    for worker in (0, 1):
        mine = [row for row in rows if row.worker == worker]
        assert [row.iteration for row in mine] == list(range(per_worker))
        assert [row.epoch for row in mine] == [i // ipe for i in range(per_worker)]
        assert sum(row.samples for row in mine) == config.train.epochs * (TRAIN // 2)
    for row in rows:
        wall = row.ended_at - row.started_at
        phases = row.compute_s + row.push_s + row.pull_s + row.wait_s
        assert phases == pytest.approx(wall, rel=0.05, abs=1e-6)
        assert row.staleness == 0
        assert row.bytes_sent > 0 and row.bytes_received > 0
        assert row.loss is not None
    first = [row.loss or 0.0 for row in rows if row.iteration < 5]
    last = [row.loss or 0.0 for row in rows if row.iteration >= per_worker - 5]
    assert sum(last) / len(last) < sum(first) / len(first)

    assert any(row.wait_s > 0 for row in rows)  # the first pusher of a clock waits

    final = sink.evaluations[-1]
    learned(outcome)
    assert final.step == per_worker  # one server version per BSP clock
    epochs = [row.epoch for row in sink.evaluations]
    assert epochs[0] == 1.0  # after the first epoch (a skipped one shows no 1.0 here)
    assert epochs[-1] == 3.0
    assert set(epochs[1:-1]) <= {2.0}  # 2.0 may be skipped while 1.0 is still being evaluated
    kinds = sink.kinds()
    assert kinds.count("process_joined") == 2 + 2 + 1
    assert kinds.count("worker_done") == 2
    assert [e.detail["epoch"] for e in sink.events if e.kind == "epoch_done"] == [0, 1, 2]
    stats = [e.detail for e in sink.events if e.kind == "server_stats"]
    assert sorted(s["rank"] for s in stats) == [0, 1]
    for s in stats:
        assert s["version"] == per_worker
        assert s["pushes"] == 2 * per_worker
        assert s["bad_frames"] == 0


@pytest.mark.timeout(120)
def test_asp_run_over_memory_shows_staleness() -> None:
    outcome = run_cluster(
        {
            "cluster.workers": 2,
            "cluster.servers": 2,
            "train.epochs": 3,
            "train.batch_size": 32,
            "sync.model": "asp",
            "model.hidden": [64],
        }
    )
    print(f"asp run: {outcome.seconds:.2f} s")
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason
    per_worker = 3 * iterations_per_epoch(2, 32)
    rows = outcome.sink.iterations
    assert len(rows) == 2 * per_worker
    assert outcome.worker_iterations == {0: per_worker, 1: per_worker}
    # Two workers in threads interleave their pulls and pushes: some gradient was computed on
    # parameters that the other worker updated before it arrived.
    assert max(row.staleness for row in rows) >= 1
    for row in rows:
        wall = row.ended_at - row.started_at
        phases = row.compute_s + row.push_s + row.pull_s + row.wait_s
        assert phases == pytest.approx(wall, rel=0.05, abs=1e-6)
        if row.iteration > 0:  # the first pull may wait for worker 0's INIT; no other does
            assert row.wait_s == 0.0
    stats = [e.detail for e in outcome.sink.events if e.kind == "server_stats"]
    assert [s["version"] for s in stats] == [2 * per_worker] * 2  # one version per push
    assert outcome.sink.evaluations[-1].step == 2 * per_worker
    learned(outcome)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("model", "extra"), [
    ("ssp", {"sync.staleness": 1}), ("dssp", {"sync.staleness": 0, "sync.range": 2}),
    ("bounded-delay", {"sync.delay": 2}), ("elastic", {"sync.lookahead": 5}),
    ("asp", {"train.overlap": True}), ("bsp", {"train.loop": "layered"}),
    ("ssp", {"sync.staleness": 1, "train.loop": "layered"}),
    ("elastic", {"sync.lookahead": 5, "train.loop": "layered"}),
])
def test_every_model_finishes_over_memory(model: str, extra: dict[str, object]) -> None:
    outcome = run_cluster({"cluster.workers": 3, "cluster.servers": 2, "train.epochs": 2,
                           "train.batch_size": 32, "sync.model": model, "model.hidden": [32],
                           "heterogeneity.stragglers": [{"rank": 1, "factor": 4.0}], **extra})
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason
    per_worker = 2 * iterations_per_epoch(3, 32)
    assert outcome.worker_iterations == {0: per_worker, 1: per_worker, 2: per_worker}
    rows = outcome.sink.iterations
    assert len(rows) == 3 * per_worker
    for row in rows:
        assert row.pushed_at is not None and row.acked_at is not None
        assert row.started_at <= row.pushed_at <= row.acked_at
    syncs = outcome.sink.syncs
    if model != "elastic":
        assert syncs == []
        return
    completed = [s for s in syncs if s.released_at is not None]
    assert syncs[0].predictor == "monitoring" and len(completed) >= 2
    assert [s.sync_index for s in completed] == list(range(len(completed)))


@pytest.mark.timeout(60)
def test_a_worker_cannot_join_as_another_and_the_run_goes_on() -> None:
    config = build_config({}, {"data.dataset": "digits", "cluster.workers": 2,
                               "cluster.servers": 1})
    transport, loop = MemoryTransport(), LoopThread("test-coordinator")
    sink = Sink()

    async def impostor() -> tuple[str, bool, list[str]]:
        coordinator = Coordinator(config, run_id=uuid.uuid4().hex, token=TOKEN,
                                  layout=model_layout(config), recorder=sink)
        address = await coordinator.start(transport, "coordinator", 0)
        connection = await transport.connect(address, token=credential(TOKEN, "worker", 1),
                                             timeout=5)
        await connection.send(dump_control(Hello(role="worker", rank=0, pid=1)))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(connection.recv(), 5)
        return str(closed.value), coordinator.outcome.done(), sink.kinds()

    try:
        reason, ended, events = loop.call(impostor(), 20)
    finally:
        loop.stop()
    assert "admitted as worker 1, it said hello as worker 0" in reason
    assert not ended  # the run was not failed by the impostor
    assert "process_joined" not in events


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("model", "extra"), [
    ("asp", {}), ("bsp", {"train.loop": "layered"}),
    ("asp", {"train.push_every": 2, "optimizer.name": "adagrad"}),
    ("ssp", {"sync.staleness": 1, "comm.momentum_correction": 0.9, "optimizer.momentum": 0.0}),
])
def test_pruned_pushes_travel_sparse_and_commit_every_clock(model: str,
                                                            extra: dict[str, object]) -> None:
    outcome = run_cluster({"cluster.workers": 2, "cluster.servers": 2, "train.epochs": 3,
                           "train.batch_size": 32, "sync.model": model, "model.hidden": [512],
                           "comm.prune": "topk:1%", **extra})
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason
    rows = [row for row in outcome.sink.iterations if row.push_bytes]
    assert rows
    for row in rows:
        # 1 % of the keys, each a uint32 key and a float32 value (2 % of the dense bytes),
        # plus up to 8 frames' headers (112 bytes each: four layers on two shards).
        assert row.push_bytes <= 0.02 * row.push_bytes_dense + 8 * 4 + 8 * 112, row
        assert row.lr_scale is not None and row.lr_scale > 0
    # Every clock was committed on every range of every shard (an empty push where a shard
    # got no key): under BSP one round per clock, so every range is at the clocks pushed.
    stats = [e.detail for e in outcome.sink.events if e.kind == "server_stats"]
    for shard in stats:
        assert shard["duplicates"] == 0
        if model == "bsp":
            assert set(shard["range_versions"]) == {len(rows) // 2}
    learned(outcome)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("model", "extra"), [
    ("asp", {}), ("bounded-delay", {"sync.delay": 2}), ("asp", {"train.overlap": True}),
    ("bsp", {"comm.wire_dtype": "float16"}),
    ("ssp", {"sync.staleness": 1, "comm.range_size": 700}),
])
def test_filtered_pulls_train_from_the_workers_copies(model: str,
                                                      extra: dict[str, object]) -> None:
    outcome = run_cluster({"cluster.workers": 2, "cluster.servers": 2, "train.epochs": 3,
                           "train.batch_size": 32, "sync.model": model, "model.hidden": [64],
                           "comm.pull_filter": "significant:0.001", "comm.refresh_every": 10,
                           **extra})
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason
    rows = outcome.sink.iterations
    # A whole pull comes first; filtered ones carry less (bounded delay's pulls are
    # received after the row's pull bytes are counted, so it is left out here).
    first = min(row.bytes_received for row in rows if row.iteration == 0)
    if model != "bounded-delay":
        assert min(row.bytes_received for row in rows) < first
    # Bounded delay and the overlapped loop train these short runs to anywhere between 12 %
    # and 82 %, with or without the filter (measured), so only the others are held to a bar.
    if model != "bounded-delay" and not extra.get("train.overlap"):
        learned(outcome)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("model", "extra"), [
    ("bsp", {}), ("bsp", {"train.loop": "layered"}), ("asp", {"comm.prune": "topk:10%"}),
    ("elastic", {"sync.lookahead": 5}),
])
def test_a_range_size_keeps_every_model_in_step(model: str, extra: dict[str, object]) -> None:
    outcome = run_cluster({"cluster.workers": 2, "cluster.servers": 2, "train.epochs": 2,
                           "train.batch_size": 32, "sync.model": model, "model.hidden": [64],
                           "comm.range_size": 1000, **extra})
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason
    per_worker = 2 * iterations_per_epoch(2, 32)
    assert outcome.worker_iterations == {0: per_worker, 1: per_worker}
    stats = [e.detail for e in outcome.sink.events if e.kind == "server_stats"]
    assert all(shard["duplicates"] == 0 for shard in stats)
    if model == "bsp":  # one round per clock on every clock range, and staleness 0
        assert all(set(shard["range_versions"]) == {per_worker} for shard in stats)
        assert {row.staleness for row in outcome.sink.iterations} == {0}
    learned(outcome)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["fifo", "filo", "stalest-first"])
def test_scheduled_requests_record_every_layer(schedule: str) -> None:
    outcome = run_cluster({"cluster.workers": 3, "cluster.servers": 2, "train.epochs": 2,
                           "train.batch_size": 32, "sync.model": "ssp", "sync.staleness": 1,
                           "model.hidden": [64], "comm.schedule": schedule,
                           "heterogeneity.stragglers": [{"rank": 1, "factor": 10.0}]})
    # the reason in full when it is not: a diff of the pair cut it short once
    assert (outcome.status, outcome.reason) == (RunStatus.FINISHED, "all epochs done"), \
        outcome.reason
    per_worker = 2 * iterations_per_epoch(3, 32)
    assert outcome.worker_iterations == {0: per_worker, 1: per_worker, 2: per_worker}
    layers = 4  # the weight and bias of two linear layers
    assert len(outcome.sink.layers) == 3 * per_worker * layers
    by_iteration: dict[tuple[int, int], list[LayerRecord]] = {}
    for row in outcome.sink.layers:
        by_iteration.setdefault((row.worker, row.iteration), []).append(row)
    for rows in by_iteration.values():
        assert sorted(r.layer for r in rows) == list(range(layers))
        assert sorted(r.pull_order for r in rows) == list(range(layers))
        assert sorted(r.push_order for r in rows) == list(range(layers))
    pulls = {tuple(r.layer for r in sorted(rows, key=lambda r: r.pull_order))
             for rows in by_iteration.values()}
    if schedule == "fifo":
        assert pulls == {(0, 1, 2, 3)}
    elif schedule == "filo":
        assert pulls == {(3, 2, 1, 0)}
    # SSP's bound holds per layer: no push more than 1 + (workers - 1) clocks stale is a
    # stronger claim than the model makes, so only that the straggler made others wait.
    assert max(r.suspend_s for r in outcome.sink.layers if r.worker != 1) > 0
    learned(outcome)
