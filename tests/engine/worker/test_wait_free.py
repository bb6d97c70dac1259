"""The wait-free loop pushes each layer from inside backward, as soon as autograd has its
gradient: driven with a real torch model and a client that records when each push leaves (no
servers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from engine.errors import ConfigError, ShuttingDown
from engine.keys import KeyRange
from engine.models.flat import FlatModel, train_step_np
from engine.models.spec import MLPSpec
from engine.plan import build_config
from engine.worker.client import Handle, PullResult, PushResult
from engine.worker.loops import Shard
from engine.worker.waitfree import WaitFreeLoop
from tests.engine.worker.hosts import timing

SPEC = MLPSpec(input_dim=4, hidden=(6, 5), num_classes=3)
rng = np.random.default_rng(0)
SHARD = Shard(rng.normal(size=(6, 4)).astype(np.float32), rng.integers(0, 3, 6), batch_size=3)


class RecordingClient:
    """Records every push with a copy of its values and whether backward was running."""

    def __init__(self, loop_state: dict[str, bool], fail: bool = False) -> None:
        self.pushes: list[dict[str, Any]] = []
        self.events: list[tuple[str, KeyRange, int, bool]] = []  # (kind, keys, clock, backward)
        self.outs: list[np.ndarray] = []  # each pull's buffer
        self.state, self.fail = loop_state, fail
        self._ids = iter(range(1, 10**6))

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> Handle[PullResult]:
        self.events.append(("pull", keys, clock, self.state["computing"]))
        self.outs.append(out)
        return Handle(next(self._ids), PullResult)

    def push(self, keys: KeyRange, values: np.ndarray, **header: Any) -> Handle[PushResult]:
        if self.fail:
            raise ShuttingDown("the server is draining")
        self.pushes.append({"keys": keys, "values": values.copy(),
                            "in_backward": self.state["computing"], **header})
        self.events.append(("push", keys, header["clock"], self.state["computing"]))
        return Handle(next(self._ids), PushResult)

    def wait(self, handle: Handle[Any], timeout: float | None = None) -> Any:
        if handle.kind is PullResult:
            return PullResult({0: 0}, 0.0, 10, 10)
        return PushResult({0: 0}, 0, 10, 10)


def make_loop(model: FlatModel, *, slowed: bool = False, fail: bool = False,
              layer_pulls: bool = False) -> tuple[WaitFreeLoop, RecordingClient]:
    config = build_config({}, {"data.dataset": "digits", "train.epochs": 1,
                               "train.loop": "wait-free", "train.layer_pulls": layer_pulls})
    state = {"computing": False}
    client = RecordingClient(state, fail)
    worker = SimpleNamespace(
        client=client, config=config, layout=model.layout,
        keys=KeyRange(0, model.num_keys), rank=0,
        **timing(active=slowed),
        record=lambda row, layers=None: None, should_stop=lambda: False,
        epoch_done=lambda epoch: None, _stopping=None)

    class Marked(WaitFreeLoop):
        def compute(self, shard: Shard, batch: np.ndarray) -> float:
            state["computing"] = True
            try:
                return super().compute(shard, batch)
            finally:
                state["computing"] = False

    return Marked(worker, model), client  # type: ignore[arg-type]


def expected_gradients(batches: list[np.ndarray], model: FlatModel) -> list[np.ndarray]:
    """The gradient of each batch at the loop's (unchanged: nothing is pulled) parameters."""
    copy = FlatModel(SPEC, seed=0)
    copy.params.copy_(model.params)
    out = []
    for batch in batches:
        train_step_np(copy, SHARD.inputs[batch], SHARD.targets[batch])
        out.append(copy.grads_np.copy())
    return out


def test_each_layer_leaves_from_backward_once_with_its_own_gradient() -> None:
    model = FlatModel(SPEC, seed=0)
    loop, client = make_loop(model)
    assert loop.train(SHARD) == 2
    segments = model.layout.segments
    assert len(client.pushes) == 2 * len(segments)
    assert all(push["in_backward"] for push in client.pushes)
    batches = SHARD.batches(np.random.default_rng([0, 0, 0]))
    for clock, gradient in enumerate(expected_gradients(batches, model)):
        sent = client.pushes[clock * len(segments):(clock + 1) * len(segments)]
        assert {push["clock"] for push in sent} == {clock}
        assert [push["final"] for push in sent] == [clock == 1] * len(segments)
        # Backward reaches the output layer first: its weights leave before the first layer's.
        order = [segments.index(next(s for s in segments if s.keys == p["keys"])) for p in sent]
        assert order.index(len(segments) - 2) < order.index(0)
        assert sorted(order) == list(range(len(segments)))
        for push in sent:
            np.testing.assert_allclose(push["values"],
                                       gradient[push["keys"].start:push["keys"].end], rtol=1e-6)


def test_with_layer_pulls_each_layers_next_pull_leaves_from_backward_behind_its_push() -> None:
    model = FlatModel(SPEC, seed=0)
    loop, client = make_loop(model, layer_pulls=True)
    assert loop.train(SHARD) == 2
    layers = len(model.layout.segments)
    first = client.events[:1 + 2 * layers]  # the first clock's pull, then its layers
    assert first[0] == ("pull", KeyRange(0, model.num_keys), 0, False)
    pairs = [first[i:i + 2] for i in range(1, len(first), 2)]
    assert all(push[:1] == ("push",) and push[2:] == (0, True) and pull == ("pull", push[1], 1,
                                                                             True)
               for push, pull in pairs)
    assert sorted(push[1].start for push, _ in pairs) == [
        s.keys.start for s in model.layout.segments]
    # The last clock's pushes are followed by no pull.
    assert [kind for kind, *_ in client.events[1 + 2 * layers:]] == ["push"] * layers
    pulls = [keys for kind, keys, *_ in client.events if kind == "pull"]
    for keys, out in zip(pulls, client.outs, strict=True):  # each layer's own part
        assert out.shape == (len(keys),) and np.shares_memory(out, model.params_np[
            keys.start:keys.end])


def test_by_default_the_next_pull_is_of_the_whole_model_once_backward_is_done() -> None:
    model = FlatModel(SPEC, seed=0)
    loop, client = make_loop(model)
    assert loop.train(SHARD) == 2
    layers = len(model.layout.segments)
    assert [event[0] for event in client.events] == (
        ["pull"] + ["push"] * layers + ["pull"] + ["push"] * layers)
    pulls = [event for event in client.events if event[0] == "pull"]
    assert pulls == [("pull", KeyRange(0, model.num_keys), clock, False) for clock in (0, 1)]


def test_a_slowed_worker_holds_its_pushes_until_its_compute_phase_is_over() -> None:
    model = FlatModel(SPEC, seed=0)
    loop, client = make_loop(model, slowed=True)
    assert loop.train(SHARD) == 2
    assert len(client.pushes) == 2 * len(model.layout.segments)
    assert not any(push["in_backward"] for push in client.pushes)


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(4, 3)
        self.unused = nn.Linear(2, 2)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.used(inputs)  # type: ignore[no-any-return]


def test_a_parameter_the_loss_does_not_reach_is_pushed_after_backward_as_zeros() -> None:
    model = FlatModel.of(WithUnused())
    model.grads_np[:] = 7.0  # what a previous step might have left
    loop, client = make_loop(model)
    assert loop.train(SHARD) == 2
    unused = {s.keys for s in model.layout.segments if s.name.startswith("unused")}
    late = [p for p in client.pushes if p["keys"] in unused]
    assert len(late) == 4 and not any(p["in_backward"] for p in late)
    assert all(not p["values"].any() for p in late)
    assert all(p["in_backward"] for p in client.pushes if p["keys"] not in unused)


def test_a_push_that_fails_inside_backward_stops_the_loop_after_backward() -> None:
    model = FlatModel(SPEC, seed=0)
    loop, client = make_loop(model, fail=True)
    assert loop.train(SHARD) == 0  # ShuttingDown ends the epochs, as from any push
    assert client.pushes == []
    assert loop.worker.stopped == ["the server is draining"]
    assert model.module.layers[0].weight.grad is not None  # backward itself completed


def test_the_hooks_are_gone_after_training() -> None:
    model = FlatModel(SPEC, seed=0)
    loop, client = make_loop(model)
    loop.train(SHARD)
    count = len(client.pushes)
    train_step_np(model, SHARD.inputs[:3], SHARD.targets[:3])
    assert len(client.pushes) == count


@pytest.mark.parametrize(("overrides", "message"), [
    ({"comm.prune": "topk:0.1"}, "filters the whole gradient"),
    ({"cluster.backend": "sim"}, "does not model train.loop wait-free"),
    ({"train.layer_pulls": True, "train.pipeline": False}, "layer_pulls .* needs train.loop "
     "wait-free and train.pipeline"),
    ({"train.layer_pulls": True, "train.loop": "layered"}, "here train.loop layered"),
])
def test_settings_the_loop_cannot_honour_are_refused(overrides: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({}, {"data.dataset": "digits", "train.loop": "wait-free", **overrides})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_each_layer_reaches_the_host_with_the_cpu_gradient() -> None:
    # On a GPU each hook copies its layer to the host while autograd's device thread runs on;
    # a copy that were not complete when the push read the host buffer would show here.
    torch.backends.cuda.matmul.allow_tf32 = False
    model = FlatModel(SPEC, seed=0, device="cuda")
    loop, client = make_loop(model)
    assert loop.train(SHARD) == 2
    segments = model.layout.segments
    assert len(client.pushes) == 2 * len(segments)
    assert all(push["in_backward"] for push in client.pushes)
    on_cpu = FlatModel(SPEC, seed=0)
    batches = SHARD.batches(np.random.default_rng([0, 0, 0]))
    for clock, gradient in enumerate(expected_gradients(batches, on_cpu)):
        for push in client.pushes[clock * len(segments):(clock + 1) * len(segments)]:
            np.testing.assert_allclose(push["values"], gradient[push["keys"].start:
                                                                push["keys"].end],
                                       rtol=1e-4, atol=1e-6)
