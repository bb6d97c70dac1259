"""Sandblaster's vector operations on shards: each shard works on its own keys, and the parts
sum to what one process would compute on the whole vectors."""

from __future__ import annotations

import numpy as np
import pytest

from engine.consistency.base import ASP
from engine.errors import BadPayload, ProtocolError
from engine.keys import KeyRange
from engine.server.optimizers import SGD, GradientSum
from engine.server.shard import ShardState
from engine.server.update import Update
from engine.server.vectors import MAX_VECTORS, ShardVectors
from engine.wire.messages import VectorOp, VectorOps, dump_control, parse_control

CUTS = [KeyRange(0, 3), KeyRange(3, 7)]


def shards(x: np.ndarray, g: np.ndarray) -> list[ShardVectors]:
    made = []
    for keys in CUTS:
        state = ShardState(keys, ASP(1), GradientSum(len(keys)))
        state.init(keys, x[keys.start:keys.end])
        state.optimizer.apply(state.params, Update(slice(0, len(keys)), g[keys.start:keys.end]))
        made.append(ShardVectors(state))
    return made


def run(parts: list[ShardVectors], *ops: VectorOp) -> list[float]:
    values = [part.apply(list(ops)) for part in parts]
    return [sum(column) for column in zip(*values, strict=True)]


def whole(parts: list[ShardVectors], name: str) -> np.ndarray:
    return np.concatenate([part._vector(name) for part in parts])


def test_the_shards_parts_add_up_to_the_whole_vectors() -> None:
    rng = np.random.default_rng(0)
    x, g = rng.normal(size=7).astype(np.float32), rng.normal(size=7).astype(np.float32)
    parts = shards(x, g)
    values = run(parts, VectorOp(op="copy", a="d", b="g"), VectorOp(op="scale", a="d", c=-2.0),
                 VectorOp(op="axpy", a="x", b="d", c=0.5), VectorOp(op="dot", a="x", b="g"),
                 VectorOp(op="dot", a="d", b="d"), VectorOp(op="zero", a="g"),
                 VectorOp(op="dot", a="g", b="x"))
    d = -2.0 * g
    moved = x + 0.5 * d
    assert np.allclose(whole(parts, "x"), moved)
    assert np.allclose(values, [moved @ g, d @ d, 0.0], rtol=1e-6)
    # x is the shard's parameters and g its gradient sum: the same arrays, not copies.
    assert np.allclose(np.concatenate([p.state.params for p in parts]), moved)
    assert not np.concatenate([p.state.optimizer.total for p in parts]).any()  # type: ignore[attr-defined]


def test_an_op_that_would_overflow_is_refused_and_nothing_after_it_runs() -> None:
    parts = shards(np.full(7, 1e30, dtype=np.float32), np.ones(7, dtype=np.float32))
    with pytest.raises(BadPayload, match="non-finite"):
        parts[0].apply([VectorOp(op="copy", a="d", b="g"), VectorOp(op="scale", a="x", c=1e10),
                        VectorOp(op="zero", a="d")])
    assert np.all(parts[0]._vector("x") == np.float32(1e30))
    assert np.all(parts[0]._vector("d") == 1)  # the copy before it stays done


def test_a_shard_keeps_a_bounded_number_of_vectors() -> None:
    (part, _) = shards(np.zeros(7, dtype=np.float32), np.zeros(7, dtype=np.float32))
    part.apply([VectorOp(op="zero", a=f"v{i}") for i in range(MAX_VECTORS - 2)])
    with pytest.raises(BadPayload, match=f"at most {MAX_VECTORS} vectors"):
        part.apply([VectorOp(op="zero", a="one_more")])


def test_only_the_lbfgs_optimizer_takes_vector_operations() -> None:
    state = ShardState(CUTS[0], ASP(1), SGD(3, lr=0.1))
    with pytest.raises(BadPayload, match="lbfgs optimizer"):
        ShardVectors(state)


def test_an_op_without_its_second_vector_is_refused() -> None:
    (part, _) = shards(np.zeros(7, dtype=np.float32), np.zeros(7, dtype=np.float32))
    with pytest.raises(BadPayload, match="needs a second vector"):
        part.apply([VectorOp(op="dot", a="x")])


@pytest.mark.parametrize("text, where", [
    ('{"type":"vector_ops","seq":0,"ops":[{"op":"dot","a":"X","b":"g"}]}', "ops.0.a"),
    ('{"type":"vector_ops","seq":0,"ops":[{"op":"scale","a":"x","c":Infinity}]}', "ops.0.c"),
    ('{"type":"vector_ops","seq":0,"ops":[{"op":"rm","a":"x"}]}', "ops.0.op"),
    ('{"type":"vector_ops","seq":0,"ops":[]}', "ops"),
])
def test_bad_vector_messages_are_refused_at_the_boundary(text: str, where: str) -> None:
    with pytest.raises(ProtocolError, match=f"at vector_ops.{where}:"):
        parse_control(text)  # the message names the field


def test_vector_messages_round_trip() -> None:
    message = VectorOps(seq=3, ops=[VectorOp(op="axpy", a="x", b="d", c=0.25)])
    assert parse_control(dump_control(message)) == message


def test_the_lbfgs_optimizer_sums_pushes_and_moves_no_parameter() -> None:
    summed = GradientSum(4)
    params = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    summed.apply(params, Update(slice(0, 4), np.ones(4, dtype=np.float32)))
    summed.apply(params, Update(slice(1, 3), np.full(2, 2.0, dtype=np.float32)))
    summed.apply(params, Update(slice(0, 4), np.array([5.0, 7.0], dtype=np.float32),
                                np.array([0, 3])))
    assert summed.total.tolist() == [6.0, 3.0, 3.0, 8.0]
    assert params.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert summed.slots() == (summed.total,)
