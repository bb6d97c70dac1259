"""The evaluator: on the coordinator's request, pull the current model and test it.

It runs in its own process so that evaluating the full test set never stalls a worker; its pull
uses ``ANY_CLOCK`` so no consistency model ever holds it back.
"""

from __future__ import annotations

import queue
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from engine import usermetrics
from engine.aio import LoopThread
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.datasets.sources import is_sparse_source, load_sparse
from engine.errors import ConnectFailed, RunFailed
from engine.keys import KeyRange
from engine.models import device as devices
from engine.models.flat import FlatModel, calibration_sample, evaluate, refresh_buffers
from engine.models.rows import RowsEvaluation, rows_model
from engine.roles.lifecycle import hello
from engine.roles.worker import check_layout, check_rows_layout, connect_client
from engine.transport.base import Transport
from engine.transport.control import Lost, SyncControl
from engine.wire.messages import Evaluate, Evaluation, Event, Exit, Stop, Welcome
from engine.wire.protocol import ANY_CLOCK, Role
from engine.wire.records import EvaluationRecord, EventRecord, UserMetricRecord
from engine.worker.client import ParameterClient
from engine.worker.timing import WALL, Clock


class Evaluator:
    """``clock``: where the time comes from (the simulator's is virtual); ``spend``: called once
    the test is computed, where its CPU time is not spent by itself (the simulator's)."""

    def __init__(self, model: FlatModel, inputs: torch.Tensor, targets: torch.Tensor,
                 client: ParameterClient, started_at: float,
                 calibration: torch.Tensor | None = None, *, clock: Clock = WALL,
                 spend: Callable[[], None] | None = None) -> None:
        self.model, self.inputs, self.targets = model, inputs, targets
        self.client, self.started_at = client, started_at
        self.clock, self.spend = clock, spend
        self.keys = KeyRange(0, model.num_keys)
        # Training samples to re-estimate batch-norm statistics from (docs/models.md).
        self.calibration = calibration

    def measure(self, epoch: float) -> EvaluationRecord:
        pulled = self.client.wait(self.client.pull(self.keys, self.model.params_np,
                                                   clock=ANY_CLOCK))
        self.model.values_to_device()
        if self.calibration is not None:
            refresh_buffers(self.model.module, self.calibration)
        forget_logged()  # the user's metrics are the test's alone (not batch-norm refreshing's)
        accuracy, loss = evaluate(self.model.module, self.inputs, self.targets)
        if self.spend is not None:
            self.spend()
        now = self.clock.now()
        return EvaluationRecord(at=now, elapsed_s=max(now - self.started_at, 0.0),
                                step=max(pulled.versions.values()), accuracy=accuracy,
                                loss=loss, epoch=epoch)


class SparseEvaluator:
    """A model of sparse samples (engine.models.rows): pulls the keys its evaluation asks for
    (sorted, in pieces of at most ``PULL_KEYS``), never the whole key space, and reports what
    the evaluation computes of them; its extra numbers are logged as the evaluator's metrics."""

    def __init__(self, evaluation: RowsEvaluation, client: ParameterClient,
                 started_at: float, *, clock: Clock = WALL,
                 spend: Callable[[], None] | None = None) -> None:
        self.evaluation, self.keys = evaluation, evaluation.keys
        self.values = np.zeros(len(self.keys), dtype=np.float32)  # the values of ``keys``
        self.client, self.started_at = client, started_at
        self.clock, self.spend = clock, spend
        self.facts: dict[str, int] = {}  # of the last measurement, for the sparse_model event

    def measure(self, epoch: float) -> EvaluationRecord:
        step = self._pull()
        measured = self.evaluation.measure(self.values)
        for name, value in measured.metrics.items():
            usermetrics.log(name, value)
        self.facts = measured.facts
        if self.spend is not None:
            self.spend()
        now = self.clock.now()
        return EvaluationRecord(at=now, elapsed_s=max(now - self.started_at, 0.0), step=step,
                                accuracy=measured.accuracy, loss=measured.loss, epoch=epoch)

    def _pull(self) -> int:
        """Pull every key into ``values``; the newest version a shard read them at (each piece
        is read when it reaches its shards, like one pull's shards)."""
        pieces = range(0, len(self.keys), PULL_KEYS)
        handles = [self.client.pull(self.keys[i:i + PULL_KEYS], self.values[i:i + PULL_KEYS],
                                    clock=ANY_CLOCK) for i in pieces]
        return max(max(self.client.wait(handle).versions.values()) for handle in handles)


# The most keys one of the evaluator's pulls asks for: 12 MiB of keys and values.
PULL_KEYS = 1 << 20


class Measures(Protocol):
    def measure(self, epoch: float) -> EvaluationRecord: ...


Build = Callable[[ParameterClient], Measures]


def _evaluator(config: RunConfig, welcome: Welcome) -> Build:
    data_dir = Path(config.data.data_dir) if config.data.data_dir else None
    dataset = load_dataset(config.data.dataset, data_dir, train_limit=config.data.train_limit)
    model = FlatModel.for_run(config.model, dataset.spec, seed=config.train.seed,
                              device=devices.resolve(config.train.device))
    check_layout(model, welcome)
    calibration = calibration_sample(model, dataset.train_x, config.train.seed)
    test_x, test_y = tensors_of_test_set(dataset.test_x, dataset.test_y)
    return lambda client: Evaluator(model, test_x, test_y, client, welcome.started_at,
                                    calibration)


def tensors_of_test_set(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The test set as tensors over the data set's own arrays: a role forked from the warm
    template shares them read-only with the other roles (a copy would cost it its own). torch
    warns about any tensor over read-only memory; the evaluator only reads these (a filter of
    this process, as engine.wire.codecs has: catch_warnings is not thread-safe)."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                            category=UserWarning)
    return torch.from_numpy(x), torch.from_numpy(y)


def _sparse_evaluator(config: RunConfig, welcome: Welcome) -> Build:
    data = load_sparse(config.data.dataset, train_limit=config.data.train_limit,
                       hash_features=config.data.hash_features)
    model = rows_model(config.model, data.spec.input_dim)
    check_rows_layout(model, welcome)
    evaluation = model.evaluation(data.train, data.test, config.optimizer.l1)
    return lambda client: SparseEvaluator(evaluation, client, welcome.started_at)


def serve_requests(evaluator: Measures, control: SyncControl) -> None:
    """Answer Evaluate requests until the coordinator says exit (or goes away)."""
    while True:
        try:
            message = control.inbox.get(timeout=1.0)
        except queue.Empty:
            continue
        if isinstance(message, Lost):
            raise RunFailed(message.reason)
        if isinstance(message, Exit):
            return
        if isinstance(message, Evaluate):
            row = evaluator.measure(message.epoch)
            if isinstance(evaluator, SparseEvaluator) and evaluator.facts:  # how sparse the
                control.send(Event(row=EventRecord(at=row.at, kind="sparse_model", detail={
                    "epoch": row.epoch, "objective": row.loss, **evaluator.facts})))  # model is
            control.send(Evaluation(row=row, final=message.final, metrics=logged_by(row)))
        elif not isinstance(message, Stop):
            raise RunFailed(f"the evaluator got an unexpected {message.type} message")


def forget_logged() -> None:
    """Drop what the user's code logged so far (outside the part being measured)."""
    usermetrics.take_open()


def logged_by(row: EvaluationRecord) -> list[UserMetricRecord]:
    """What the user's code logged during the evaluation ``row``: a value per name, the mean
    over the test set's batches, at the evaluation's step."""
    return [UserMetricRecord(role="evaluator", rank=0, iteration=row.step, at=row.at, name=name,
                             value=value) for name, value in usermetrics.take_open().items()]


def run_evaluator(transport: Transport, coordinator: str, *, token: str,
                  node: str = "127.0.0.1") -> None:
    io = LoopThread("evaluator-io")
    control, welcome = SyncControl.open(io, transport, coordinator,
                                        hello("evaluator", 0, node),
                                        token=token, timeout=60.0)
    config = RunConfig.model_validate(welcome.config)
    torch.set_num_threads(config.train.torch_threads)
    with control.reporting():
        make = _sparse_evaluator if is_sparse_source(config.data.dataset) else _evaluator
        build = make(config, welcome)
    try:
        client = connect_client(transport, welcome, config, Role.EVALUATOR, 0, token, io,
                                control=control)
    except ConnectFailed:
        # A run that ends while the evaluator is still loading its data has already closed its
        # servers: nothing is left to evaluate, and that is no failure of the evaluator's.
        stopped = _told_to_stop(control, STOP_GRACE_S)
        control.close()
        io.stop()
        if stopped:
            return
        raise
    try:
        with control.reporting(own_errors=False), usermetrics.collecting():  # a crash in the
            serve_requests(build(client), control)  # user's model (or its psctl.log), say
    finally:
        client.close()
        control.close()
        io.stop()


# How long a failed connection waits for the coordinator's word that the run is over.
STOP_GRACE_S = 2.0


def _told_to_stop(control: SyncControl, within_s: float) -> bool:
    """Whether the coordinator says stop or exit within ``within_s`` (messages are consumed:
    the evaluator is about to leave)."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = control.inbox.get(timeout=left)
        except queue.Empty:
            return False
        if isinstance(message, Stop | Exit):
            return True
    return False
