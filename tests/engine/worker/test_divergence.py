"""A diverged model ends the run saying so: a NaN or infinite training loss stops the worker
before its gradient leaves, a non-finite push is refused as such, and a NaN test loss travels
to the coordinator intact."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.errors import BadPayload, Diverged, NonFinitePush, RemoteError
from engine.keys import KeyRange
from engine.wire.messages import Evaluation, Fatal, dump_control, parse_control
from engine.wire.protocol import DType, Frame, MsgType, decode, encode
from engine.wire.records import EvaluationRecord, divergence
from engine.worker.connection import refusal
from engine.worker.loops import finite_loss


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_non_finite_training_loss_is_a_divergence(loss: float) -> None:
    with pytest.raises(Diverged, match=f"training loss is {loss}"):
        finite_loss(loss)
    assert finite_loss(0.25) == 0.25


def _push(values: np.ndarray, kind: MsgType = MsgType.PUSH) -> bytes:
    return bytes(encode(Frame(kind, 1, KeyRange(0, len(values)), dtype=DType.FLOAT32,
                              payload=values)))


def test_a_pushed_gradient_with_nan_is_refused_as_non_finite_and_an_init_as_bad() -> None:
    values = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    with pytest.raises(NonFinitePush, match="PUSH values contain NaN or infinity"):
        decode(_push(values), max_bytes=2**20)
    with pytest.raises(BadPayload) as caught:
        decode(_push(values, MsgType.INIT), max_bytes=2**20)
    assert not isinstance(caught.value, NonFinitePush)


def test_the_servers_refusal_of_a_non_finite_push_reaches_the_worker_as_divergence() -> None:
    said = refusal(1, 7, NonFinitePush.__name__, "PUSH values contain NaN or infinity")
    assert isinstance(said, Diverged) and "shard server 1 refused its gradient" in str(said)
    other = refusal(1, 7, "BadPayload", "shape (3,) of float32 needs 12 bytes")
    assert isinstance(other, RemoteError) and "refused request 7" in str(other)


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_non_finite_test_loss_travels_to_the_coordinator_and_reads_as_divergence(
        loss: float) -> None:
    row = EvaluationRecord(at=1.0, elapsed_s=1.0, step=40, accuracy=0.1, loss=loss, epoch=1.0)
    message = parse_control(dump_control(Evaluation(row=row)))
    assert isinstance(message, Evaluation)
    reason = divergence(message.row)
    assert reason is not None and reason.startswith("the model diverged")
    assert "step 40" in reason


def test_a_divergence_report_round_trips() -> None:
    fatal = parse_control(dump_control(Fatal(message="the model diverged", diverged=True)))
    assert isinstance(fatal, Fatal) and fatal.diverged
    assert not Fatal(message="boom").diverged
