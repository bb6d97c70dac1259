"""The worker role: join the coordinator, load this worker's data, train, report."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine import usermetrics
from engine.aio import LoopThread
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.datasets.sources import is_sparse_source, load_sparse
from engine.errors import RunFailed
from engine.faults import FaultPlan
from engine.keys import KeyRange
from engine.models import device as devices
from engine.models.flat import FlatModel
from engine.models.rows import RowsModel, rows_model
from engine.policies.loops import ANY_ROWS, WORKER_LOOPS, loop_name
from engine.roles.lifecycle import hello
from engine.roles.links import worker_transport
from engine.transport.base import Transport
from engine.transport.control import SyncControl
from engine.wire.messages import Event, Replicas, Welcome, layout_info
from engine.wire.protocol import Role
from engine.wire.records import EventRecord
from engine.worker.client import (
    PLAIN_WIRE,
    LinkFaults,
    ParameterClient,
    ShardAddress,
    WireFormat,
)
from engine.worker.loops import Shard, Worker, shard_for
from engine.worker.sandblaster import sandblaster_shard


def run_worker(transport: Transport, coordinator: str, rank: int, *, token: str,
               node: str = "127.0.0.1") -> int:
    """The worker role: join, load data, train, report. Returns the iterations done."""
    io = LoopThread(f"worker-{rank}-io")
    control, welcome = SyncControl.open(io, transport, coordinator,
                                        hello("worker", rank, node),
                                        token=token, timeout=60.0)
    config = RunConfig.model_validate(welcome.config)
    torch.set_num_threads(config.train.torch_threads)
    with control.reporting():  # a bad data or model file fails the run with its reason
        shard, model = _shard_and_model(config, rank, welcome)
    client = connect_client(worker_transport(transport, config), welcome, config, Role.WORKER,
                            rank, token, io,
                            wire=WireFormat.of(config.comm.wire_dtype, config.comm.compress,
                                               keeps_copy=config.comm.pull_filter != "none",
                                               range_size=config.comm.range_size),
                            faults=link_faults(config), duplicates_ok=True,
                            control=control)
    try:
        # A crash in the user's model (or a bug) fails the run at once with its message;
        # psctl's own errors here are the run ending, or the coordinator saying why itself.
        with control.reporting(own_errors=False), usermetrics.collecting():
            return Worker(welcome, rank, control, client).run(
                shard, model, WORKER_LOOPS.get(loop_name(config)))
    finally:
        stats = client.link_stats
        if stats["dropped"] or stats["resent"]:
            control.send(Event(row=EventRecord(at=time.time(), kind="link_faults",
                                               detail={"rank": rank, **stats})))
        client.close()
        control.close()
        io.stop()


def _shard_and_model(config: RunConfig, rank: int,
                     welcome: Welcome) -> tuple[Shard, FlatModel | RowsModel]:
    # A worker that joined a scaled job may have a rank past the count it was given.
    where = {"rank": rank % config.cluster.workers, "workers": config.cluster.workers,
             "seed": config.train.seed, "batch_size": config.train.batch_size}
    if is_sparse_source(config.data.dataset):
        sparse = load_sparse(config.data.dataset, train_limit=config.data.train_limit,
                             hash_features=config.data.hash_features)
        rows = rows_model(config.model, sparse.spec.input_dim)
        check_rows_layout(rows, welcome)
        return shard_for(sparse.train, sparse.train.labels, **where), rows
    data_dir = Path(config.data.data_dir) if config.data.data_dir else None
    dataset = load_dataset(config.data.dataset, data_dir, train_limit=config.data.train_limit)
    model = FlatModel.for_run(config.model, dataset.spec, seed=config.train.seed,
                              device=devices.resolve(config.train.device))
    check_layout(model, welcome)
    if WORKER_LOOPS.can(loop_name(config), ANY_ROWS):  # any worker may be given any rows
        return sandblaster_shard(dataset.train_x, dataset.train_y, config), model
    return shard_for(dataset.train_x, dataset.train_y, **where), model


def check_layout(model: FlatModel, welcome: Welcome) -> None:
    """The model built here must be the one the coordinator laid the keys out for: a model file
    that builds something else on another node would otherwise train garbage."""
    expected = [(s.name, tuple(s.shape)) for s in welcome.segments]
    built = [(s.name, s.shape) for s in model.layout.segments]
    if built != expected:
        first = next((f"{b} here, {e} there" for b, e in zip(built, expected, strict=False)
                      if b != e), f"{len(built)} parameters here, {len(expected)} there")
        raise RunFailed(f"the model built here differs from the coordinator's: {first}")


def check_rows_layout(model: RowsModel, welcome: Welcome) -> None:
    """The model of sparse samples built here must lay out the coordinator's keys: its sparse
    ranges and rules decide what the servers store and start from, and nobody sends values."""
    ours = layout_info(model.layout())
    if ours != welcome.segments:
        first = next((f"{a} here, {b} there" for a, b in zip(ours, welcome.segments,
                                                              strict=False) if a != b),
                     f"{len(ours)} segments here, {len(welcome.segments)} there")
        raise RunFailed(f"the model of sparse samples built here lays out other keys than the "
                        f"coordinator's: {first}")


def link_faults(config: RunConfig) -> LinkFaults | None:
    """The data-plane faults injected into a worker's connections, if any (``--fault``)."""
    plan = FaultPlan.of(config.fault.inject)
    if not (plan.drop or plan.delay_s):
        return None
    return LinkFaults(plan.drop, plan.delay_s, config.fault.resend_after_s, config.train.seed)


def connect_client(transport: Transport, welcome: Welcome, config: RunConfig, role: Role,
                   rank: int, token: str, io: LoopThread,
                   wire: WireFormat = PLAIN_WIRE, faults: LinkFaults | None = None,
                   duplicates_ok: bool = False,
                   control: SyncControl | None = None) -> ParameterClient:
    """A connected client; ``wire`` says how its values travel (the evaluator's stay
    float32, so it measures the model the servers hold exactly). With ``control``, the
    coordinator's word on where the shards' copies are reaches the client at once."""
    shards = [ShardAddress(s.index, s.address, KeyRange(s.start, s.end),
                           tuple(welcome.backups.get(s.index, ()))) for s in welcome.shards]
    client = ParameterClient(
        transport, shards, token=token, run=bytes.fromhex(welcome.run_id)[:16], role=role,
        rank=rank, connect_timeout_s=config.cluster.connect_timeout_s,
        request_timeout_s=config.cluster.request_timeout_s,
        max_frame_bytes=config.cluster.max_frame_bytes, io=io, wire=wire, faults=faults,
        duplicates_ok=duplicates_ok)
    client.connect()
    if control is not None:
        control.on(Replicas, lambda message: client.set_copies(message.copies))
    return client
