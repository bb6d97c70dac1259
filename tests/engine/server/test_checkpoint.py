"""A shard's checkpoint (engine.server.checkpoint): saved and restored into a fresh shard built
the same way, it holds the same values, optimizer state, versions and clocks; its consistency
controller decides as the original's would, except that DSSP and ElasticBSP start their timing
history again (they must stay live: every worker goes on, none is refused its next clock); a
file that does not fit the shard, or is damaged, is refused with a StoreError before anything is
copied; writes are atomic."""

from __future__ import annotations

import os
import pickle
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.config import RunConfig
from engine.consistency.base import NO_TIMING, PushTiming
from engine.consistency.elastic import MONITOR_CLOCK, ElasticBSP
from engine.consistency.registry import CONSISTENCY_MODELS
from engine.consistency.ssp import DSSP
from engine.errors import DuplicatePush, PsctlError, StoreError
from engine.keys import KeyLayout, KeyRange, Segment
from engine.roles.server import build_shard
from engine.server.checkpoint import Snapshot, restore, save, shard_file
from engine.server.shard import ShardState

pytestmark = pytest.mark.timeout(30)

KEYS = KeyRange(0, 8)
# two layers, so the shard has two clock ranges: keys 0-4 and 5-7
LAYER_W, LAYER_B = KeyRange(0, 5), KeyRange(5, 8)
LAYOUT = KeyLayout((Segment("w", (5,), LAYER_W), Segment("b", (3,), LAYER_B)))
START = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "sgd-momentum": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    "sgd-nesterov-decay": {"name": "sgd", "lr": 0.05, "momentum": 0.5, "nesterov": True,
                           "weight_decay": 0.01},
    "adam": {"name": "adam", "lr": 0.01},
    "adagrad": {"name": "adagrad", "lr": 0.01},
    "rmsprop": {"name": "rmsprop", "lr": 0.001},
}


def run_config(model: str = "asp", *, workers: int = 3, optimizer: str = "sgd-momentum",
               servers: int = 1, **sync: Any) -> RunConfig:
    return RunConfig.model_validate({
        "cluster": {"workers": workers, "servers": servers},
        "sync": {"model": model, "staleness": 1, "range": 1, "lookahead": 4, **sync},
        "optimizer": OPTIMIZERS[optimizer],
    })


def fresh(config: RunConfig, keys: KeyRange = KEYS, layout: KeyLayout = LAYOUT) -> ShardState:
    return build_shard(config, keys, layout)


def started(config: RunConfig) -> ShardState:
    state = fresh(config)
    assert state.init(KEYS, START)
    return state


def grad(worker: int, clock: int, size: int = 8) -> np.ndarray:
    return np.random.default_rng([worker, clock]).normal(size=size).astype(np.float32)


def fingerprint(state: ShardState) -> tuple[Any, ...]:
    """Everything a checkpoint holds, bit for bit."""
    return (state.params.tobytes(), tuple(s.tobytes() for s in state.optimizer.slots()),
            state.versions.tolist(), state.pushes, state.clocks.next.tolist(), state.initialized)


def saved(state: ShardState, folder: Path, seq: int = 1) -> Path:
    path, size, seconds = save(state, folder, 0, seq)
    assert path == shard_file(folder, 0) == folder / "shard-0.npz"
    assert size == path.stat().st_size > 0 and seconds >= 0
    return path


def round_trip(state: ShardState, config: RunConfig, folder: Path) -> ShardState:
    again = fresh(config)
    assert restore(again, saved(state, folder, seq=5)) == 5
    return again


def outcome(state: ShardState, worker: int, clock: int, keys: KeyRange = KEYS,
            timing: PushTiming = NO_TIMING) -> str:
    """Push ``worker``'s gradient of ``clock`` for ``keys``: accepted, or the refusal."""
    try:
        state.push(worker, clock, keys, grad(worker, clock)[keys.start:keys.end], timing)
    except PsctlError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


# -- round trips ------------------------------------------------------------------------------


def mixed_pushes(state: ShardState, clocks: int) -> None:
    """Three workers for ``clocks`` clocks: dense, layer by layer, and sparse pushes."""
    for clock in range(clocks):
        state.push(0, clock, KEYS, grad(0, clock), PushTiming(pushed_at=clock + 0.1))
        state.push(1, clock, LAYER_B, grad(1, clock, 3))
        state.push(1, clock, LAYER_W, grad(1, clock, 5))
        sparse = np.array([1, 6] if clock % 2 else [3], dtype=np.uint32)
        state.push(2, clock, KEYS, grad(2, clock, len(sparse)), index=sparse)


@pytest.mark.parametrize("model", ["asp", "bsp"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_restored_shard_holds_everything_and_steps_identically(
        tmp_path: Path, model: str, optimizer: str) -> None:
    config = run_config(model, optimizer=optimizer)
    original = started(config)
    mixed_pushes(original, 3)
    assert any(slot.any() for slot in original.optimizer.slots())
    restored = round_trip(original, config, tmp_path)
    assert fingerprint(restored) == fingerprint(original)
    assert restored.params.dtype == np.float32
    assert (restored.version, restored.clocks.shard_clocks()) == (original.version, [3, 3, 3])
    # the same further pushes move both bit for bit the same (one full round under BSP)
    for state in (original, restored):
        state.push(0, 3, KEYS, grad(0, 9))
        state.push(1, 3, KEYS, grad(1, 9))
        state.push(2, 3, KEYS, grad(2, 3, 2), index=np.array([0, 7], np.uint32))
    assert fingerprint(restored) == fingerprint(original)
    assert restored.params.tobytes() != started(config).params.tobytes()


def test_adam_keeps_its_per_key_step_counts(tmp_path: Path) -> None:
    config = run_config("asp", workers=1, optimizer="adam")
    original = started(config)
    original.push(0, 0, KEYS, grad(0, 0))
    original.push(0, 1, KEYS, grad(0, 1, 2), index=np.array([2, 5], np.uint32))
    restored = round_trip(original, config, tmp_path)
    steps = restored.optimizer.slots()[2]
    assert steps.tolist() == [1, 1, 2, 1, 1, 2, 1, 1]
    original.push(0, 2, KEYS, grad(0, 2, 1), index=np.array([5], np.uint32))
    restored.push(0, 2, KEYS, grad(0, 2, 1), index=np.array([5], np.uint32))
    assert restored.params.tobytes() == original.params.tobytes()


def test_a_shard_saved_before_any_push_restores_initialised(tmp_path: Path) -> None:
    config = run_config("bsp")
    original = started(config)
    restored = round_trip(original, config, tmp_path)
    assert restored.initialized
    assert restored.params.tolist() == START.tolist()
    assert restored.clocks.next.tolist() == [[0, 0]] * 3
    assert restored.pull_ready(0, 0) and not restored.pull_ready(0, 1)


def test_the_sequence_number_comes_back(tmp_path: Path) -> None:
    config = run_config()
    state = started(config)
    path, _, _ = save(state, tmp_path, 3, 41)
    assert path == tmp_path / "shard-3.npz"
    assert restore(fresh(config), path) == 41


# -- every consistency model ------------------------------------------------------------------

# who tries to work next; a worker only pushes its next clock once its pull for it is ready
ORDER = [0, 0, 0, 1, 0, 0, 2, 1, 1, 0, 0, 2, 1, 0, 0, 0, 2, 0]
# The models whose controllers keep a timing history (push times, busy intervals). A restore
# starts it again, so right after one they may decide otherwise than the original would; the
# others must decide exactly as the original would.
TIMED = ("dssp", "elastic")
UNTIMED = tuple(m for m in CONSISTENCY_MODELS.names() if m not in TIMED)
Timing = Callable[[int, int], PushTiming]  # (worker, clock) -> what the worker stamps on it


def no_timing(worker: int, clock: int) -> PushTiming:
    return NO_TIMING


def paced(*seconds: float, last: int | None = None) -> Timing:
    """Worker w takes ``seconds[w]`` an iteration: its push of clock c leaves at (c + 1) times
    that; its push of clock ``last`` is its final one."""

    def timing(worker: int, clock: int) -> PushTiming:
        return PushTiming(pushed_at=(clock + 1) * seconds[worker], final=clock == last)

    return timing


def clock_of(state: ShardState, worker: int) -> int:
    return int(state.clocks.next[worker].min())


def push_next(state: ShardState, worker: int, timing: Timing = no_timing, *,
              layers: bool = False) -> list[str]:
    """``worker`` pushes its next clock, whole or layer by layer (what happened to each push)."""
    clock = clock_of(state, worker)
    return [outcome(state, worker, clock, keys, timing(worker, clock))
            for keys in ((LAYER_B, LAYER_W) if layers else (KEYS,))]


def drive(state: ShardState, order: Iterable[int], *, layers: bool = False,
          timing: Timing = no_timing) -> list[str]:
    """Each worker in ``order`` pulls its next clock and, when the pull is ready, pushes it
    (whole, or layer by layer); returns what happened to every push."""
    happened = []
    for worker in order:
        clock = clock_of(state, worker)
        if not state.pull_ready(worker, clock):
            happened.append(f"{worker} waits at {clock}")
            continue
        happened.extend(push_next(state, worker, timing, layers=layers))
    return happened


def readiness(state: ShardState, top: int = 8) -> list[list[bool]]:
    """May each worker pull clocks 0 to ``top``?"""
    return [[state.pull_ready(worker, clock) for clock in range(top)] for worker in range(3)]


def next_clock_goes_through(state: ShardState, worker: int, timing: Timing, *,
                            layers: bool = False) -> int:
    """``worker``'s pull for its next clock becomes ready, the others pushing their next clocks
    in turn while it waits, and its push is accepted; returns how many clocks the others
    pushed meanwhile."""
    others, pushed = [w for w in range(state.clocks.workers) if w != worker], 0
    for _ in range(50):
        if state.pull_ready(worker, clock_of(state, worker)):
            assert push_next(state, worker, timing, layers=layers) == ["accepted"] * (
                2 if layers else 1), (worker, state.clocks.shard_clocks())
            return pushed
        ready = [w for w in others if state.pull_ready(w, clock_of(state, w))]
        assert ready, (f"deadlock: worker {worker} waits at clock {clock_of(state, worker)}, "
                       f"no other pull is ready at clocks {state.clocks.shard_clocks()}")
        for other in ready:
            assert push_next(state, other, timing, layers=layers) == ["accepted"] * (
                2 if layers else 1), (other, state.clocks.shard_clocks())
            pushed += 1
    raise AssertionError(f"worker {worker} still waits at clock {clock_of(state, worker)}")


def round_robin(state: ShardState, speeds: tuple[float, ...], clocks: int = 20, *,
                layers: bool = False) -> int:
    """Every worker goes on to ``clocks`` past the furthest one, in turns: each turn, every
    worker whose next pull is ready pushes that clock (the last one marked final). Asserts that
    every push is accepted and that some pull is always ready (no deadlock); returns the
    turns taken."""
    end = max(state.clocks.shard_clocks()) + clocks
    timing = paced(*speeds, last=end - 1)
    turns = 0
    while live := [w for w in range(state.clocks.workers) if clock_of(state, w) < end]:
        turns += 1
        assert turns <= 2 * clocks * len(speeds), "no progress"
        assert any(state.pull_ready(w, clock_of(state, w)) for w in live), (
            f"deadlock at clocks {state.clocks.shard_clocks()}")
        for worker in live:
            if state.pull_ready(worker, clock_of(state, worker)):
                assert push_next(state, worker, timing, layers=layers) == ["accepted"] * (
                    2 if layers else 1), (worker, state.clocks.shard_clocks())
    assert state.clocks.shard_clocks() == [end] * state.clocks.workers
    return turns


def test_the_timed_models_are_those_that_keep_a_timing_history() -> None:
    assert set(TIMED) < set(CONSISTENCY_MODELS.names())
    assert {"bsp", "asp", "ssp", "bounded-delay"} <= set(UNTIMED)
    for model in CONSISTENCY_MODELS.names():
        controller = fresh(run_config(model)).controller
        assert isinstance(controller, DSSP | ElasticBSP) == (model in TIMED), model


def test_the_scenario_leaves_workers_at_different_clocks() -> None:
    for model in CONSISTENCY_MODELS.names():
        state = started(run_config(model))
        drive(state, ORDER)
        assert state.clocks.next.max() > 1, model
        if model == "bsp":  # worker 0 pushed the round the others have not
            assert state.clocks.shard_clocks() == [4, 3, 3]


@pytest.mark.parametrize("layers", [False, True], ids=["whole", "by-layer"])
@pytest.mark.parametrize("model", UNTIMED)
def test_a_restored_controller_decides_as_the_original_would(tmp_path: Path, model: str,
                                                             layers: bool) -> None:
    config = run_config(model)
    original = started(config)
    drive(original, ORDER, layers=layers)
    restored = round_trip(original, config, tmp_path)
    assert readiness(restored) == readiness(original)
    assert restored.params.tobytes() == original.params.tobytes()
    if original.controller.accumulates:
        # the open round is rolled back: everybody pushes it (again)
        round_ = int(original.versions.min())
        assert restored.clocks.next.tolist() == [[round_, round_]] * 3
        assert original.clocks.next.tolist() != restored.clocks.next.tolist()
        for worker in range(3):
            if original.clocks.next[worker, 0] > round_:
                assert outcome(original, worker, round_).startswith("DuplicatePush")
        # the original has its open round's pushes; the restored shard gets them again
        pushes = 2 if layers else 1
        restored_log = drive(restored, [0, 1, 2], layers=layers)
        original_log = drive(original, [1, 2], layers=layers)
        assert restored_log == ["accepted"] * 3 * pushes
        assert original_log == ["accepted"] * 2 * pushes
    else:
        assert restored.clocks.next.tolist() == original.clocks.next.tolist()
    # from here on the two see the same pushes and take the same decisions
    later = [2, 2, 1, 0, 0, 0, 1, 2, 0, 1, 1, 2, 0]
    log = drive(restored, later, layers=layers)
    assert log == drive(original, later, layers=layers)
    # the continuation is not vacuous: pushes go through and, where the model holds workers
    # back, some wait
    assert "accepted" in log
    assert any("waits" in entry for entry in log) == (model != "asp")
    assert readiness(restored) == readiness(original)
    assert fingerprint(restored)[:3] == fingerprint(original)[:3]
    assert restored.clocks.next.tolist() == original.clocks.next.tolist()


@pytest.mark.parametrize("model", [m for m in UNTIMED if m != "bsp"])
def test_the_next_clock_of_every_worker_is_accepted_after_restore(
        tmp_path: Path, model: str) -> None:
    config = run_config(model)
    original = started(config)
    drive(original, ORDER)
    restored = round_trip(original, config, tmp_path)
    for worker in (2, 1, 0):
        clock = int(original.clocks.next[worker].min())
        expected = outcome(original, worker, clock)
        assert outcome(restored, worker, clock) == expected, (worker, clock)


SPEEDS = (1.0, 2.0, 3.0)  # seconds an iteration of workers 0, 1 and 2


@pytest.mark.parametrize("layers", [False, True], ids=["whole", "by-layer"])
@pytest.mark.parametrize("model", TIMED)
def test_a_restored_timed_controller_stays_live(tmp_path: Path, model: str,
                                                layers: bool) -> None:
    config = run_config(model)
    original = started(config)
    drive(original, ORDER, layers=layers, timing=paced(*SPEEDS))
    assert len(set(original.clocks.shard_clocks())) > 1
    restored = round_trip(original, config, tmp_path)
    assert restored.clocks.next.tolist() == original.clocks.next.tolist()
    assert restored.params.tobytes() == original.params.tobytes()
    # every worker's next clock goes through (the others catching up where it must wait)
    for worker in (2, 1, 0):
        next_clock_goes_through(restored, worker, paced(*SPEEDS), layers=layers)
    # and the run goes on: 20 more clocks, every worker pushing in turn
    assert round_robin(restored, SPEEDS, layers=layers) >= 20


@pytest.mark.parametrize("model", TIMED)
def test_a_restore_right_after_the_start_stays_live(tmp_path: Path, model: str) -> None:
    config = run_config(model)
    original = started(config)
    restored = round_trip(original, config, tmp_path)
    assert restored.clocks.shard_clocks() == [0, 0, 0]
    assert all(restored.pull_ready(worker, 0) for worker in range(3))
    assert round_robin(restored, SPEEDS) >= 20


def test_elastic_workers_ahead_of_an_old_barrier_go_on_after_a_restore(tmp_path: Path) -> None:
    config = run_config("elastic", workers=2)
    original = started(config)

    def push(state: ShardState, worker: int, clock: int, at: float) -> None:
        state.push(worker, clock, KEYS, grad(worker, clock), PushTiming(pushed_at=at))

    # worker 0 takes 1 s an iteration, worker 1 3 s: after the monitoring barrier at clock 1,
    # ZipLine lets worker 0 run to clock 4 while worker 1 goes to clock 2
    for clock, at in ((0, 1.0), (1, 2.0)):
        push(original, 0, clock, at)
    for clock, at in ((0, 3.0), (1, 6.0)):
        push(original, 1, clock, at)
    push(original, 0, 2, 7.0)
    push(original, 0, 3, 8.0)
    assert isinstance(original.controller, ElasticBSP)
    assert original.controller.barrier_clocks() == [4, 2]
    assert original.clocks.shard_clocks() == [4, 2]  # worker 0 is past the barrier of 1
    restored = round_trip(original, config, tmp_path)
    assert isinstance(restored.controller, ElasticBSP)
    # monitoring again from where each worker is: two more pushes each
    assert restored.controller.barrier_clocks() == [5, 3]
    assert restored.pull_ready(0, 4) and restored.pull_ready(1, 2)
    push(restored, 0, 4, 9.0)
    push(restored, 0, 5, 10.0)
    assert not restored.pull_ready(0, 6)  # waits for worker 1 at its barrier
    assert next_clock_goes_through(restored, 0, paced(1.0, 3.0)) == 2  # worker 1: 2 and 3
    assert round_robin(restored, (1.0, 3.0)) >= 20


def test_dssp_is_held_to_its_staleness_bound_until_it_has_timings_again(
        tmp_path: Path) -> None:
    config = run_config("dssp", workers=2)  # staleness 1, stretched by up to 1
    original = started(config)
    timing = paced(1.0, 3.0)
    for worker, clock in ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)):
        assert push_next(original, worker, timing) == ["accepted"], (worker, clock)
    # worker 0 leads worker 1 (at clock 2) by 2 > staleness: let through, as it is predicted
    # to end its next iteration (at 5 s) before worker 1 ends its own (at 9 s)
    assert original.clocks.shard_clocks() == [4, 2]
    assert original.pull_ready(0, 4)
    restored = round_trip(original, config, tmp_path)
    # without timings the bound is the staleness: worker 0 waits for worker 1's clock 2
    assert not restored.pull_ready(0, 4)
    assert next_clock_goes_through(restored, 0, timing) == 1
    assert restored.clocks.shard_clocks() == [5, 3]
    assert round_robin(restored, (1.0, 3.0)) >= 20


@pytest.mark.parametrize("model", TIMED)
def test_the_timing_history_starts_empty_after_a_restore(tmp_path: Path, model: str) -> None:
    config = run_config(model, workers=2)
    original = started(config)
    for clock in range(2):
        for worker in range(2):
            original.push(worker, clock, KEYS, grad(worker, clock),
                          PushTiming(pushed_at=1000.0 + clock))
    assert isinstance(original.controller, DSSP | ElasticBSP)
    assert original.controller.timings.intervals(0) == [1.0]
    restored = round_trip(original, config, tmp_path)
    controller = restored.controller
    assert isinstance(controller, DSSP | ElasticBSP)
    timings = controller.timings
    assert [timings.last_push(w) for w in range(2)] == [None, None]
    assert [timings.intervals(w) for w in range(2)] == [[], []]
    # the first push after the restore starts the history; the second makes an interval
    for clock, at in ((2, 1010.0), (3, 1012.5)):
        for worker in range(2):
            restored.push(worker, clock, KEYS, grad(worker, clock), PushTiming(pushed_at=at))
    assert [timings.last_push(w) for w in range(2)] == [1012.5, 1012.5]
    assert [timings.intervals(w) for w in range(2)] == [[2.5], [2.5]]


def test_elastic_monitors_again_from_each_workers_clock_after_a_restore(
        tmp_path: Path) -> None:
    config = run_config("elastic")
    original = started(config)
    drive(original, ORDER * 2, timing=paced(*SPEEDS))
    reported = original.controller.take_syncs()
    completed = [r.sync_index for r in reported if r.released_at is not None]
    assert len(completed) >= 2  # the original placed and passed barriers from its timings
    restored = round_trip(original, config, tmp_path)
    assert isinstance(restored.controller, ElasticBSP)
    clocks = restored.clocks.shard_clocks()
    assert clocks == original.clocks.shard_clocks() and len(set(clocks)) > 1
    assert restored.controller.barrier_clocks() == [c + MONITOR_CLOCK for c in clocks]
    assert restored.controller.take_syncs() == []  # the replay reports nothing
    round_robin(restored, SPEEDS)
    after = restored.controller.take_syncs()
    assert after and after[0].released_at is not None  # the monitoring barrier passed
    # numbered past every decision the original reported: none overwrites a recorded one
    assert after[0].sync_index > max(r.sync_index for r in reported)
    indexes = [r.sync_index for r in after]
    assert indexes == sorted(indexes)


def alone_to_the_end(state: ShardState, worker: int, end: int, timing: Timing) -> int | None:
    """``worker`` pushes its clocks up to ``end`` while the others do nothing; None if it got
    there, else the clock whose pull it waits for."""
    while clock_of(state, worker) < end:
        if not state.pull_ready(worker, clock_of(state, worker)):
            return clock_of(state, worker)
        clock = clock_of(state, worker)
        state.push(worker, clock, KEYS, grad(worker, clock), timing(worker, clock))
    return None


def test_elastic_a_worker_that_had_finished_does_not_hold_the_others_after_a_restore(
        tmp_path: Path) -> None:
    config = run_config("elastic", workers=2)
    original = started(config)
    end, timing = 12, paced(1.0, 3.0, last=11)
    while clock_of(original, 0) < end:  # worker 0 (1 s an iteration) runs to its end
        worker = 1 if clock_of(original, 1) * 3.0 < clock_of(original, 0) * 1.0 else 0
        if not original.pull_ready(worker, clock_of(original, worker)):
            worker = 1 - worker
        clock = clock_of(original, worker)
        original.push(worker, clock, KEYS, grad(worker, clock), timing(worker, clock))
    clocks = original.clocks.shard_clocks()  # worker 0 has made its final push
    assert clocks[0] == end and clocks[1] <= end - 4  # worker 1 (3 s) is far behind
    restored = round_trip(original, config, tmp_path)
    if (stuck := alone_to_the_end(original, 1, end, timing)) is not None:
        pytest.fail(f"the original holds worker 1 at clock {stuck}")  # not the bug above
    stuck = alone_to_the_end(restored, 1, end, timing)
    assert stuck is None, f"worker 1 waits at clock {stuck} for worker 0, which has ended"


# -- duplicates -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["asp", "bsp", "ssp"])
def test_a_clock_below_the_restored_next_clock_is_a_duplicate(tmp_path: Path,
                                                               model: str) -> None:
    config = run_config(model, workers=2)
    original = started(config)
    for clock in range(2):
        for worker in range(2):
            original.push(worker, clock, KEYS, grad(worker, clock))
    restored = round_trip(original, config, tmp_path)
    before = fingerprint(restored)
    for clock in (0, 1):
        with pytest.raises(DuplicatePush, match=f"^worker 1 already committed clock {clock} "
                                                "on clock range 0$"):
            restored.push(1, clock, KEYS, grad(1, clock))
    with pytest.raises(DuplicatePush, match="clock 1 on clock range 1$"):
        restored.push(0, 1, LAYER_B, grad(0, 1, 3))
    assert fingerprint(restored) == before
    assert restored.duplicates == 3
    restored.push(1, 2, KEYS, grad(1, 2))  # its next clock is accepted
    assert restored.clocks.shard_clocks() == [2, 3]


# -- refusals ---------------------------------------------------------------------------------


def rewritten(path: Path, change: Callable[[dict[str, np.ndarray]], object]) -> Path:
    """A copy of the checkpoint at ``path`` with some arrays changed."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    change(arrays)
    bad = path.with_name("bad.npz")
    np.savez(bad, **arrays)
    return bad


@pytest.fixture
def checkpointed(tmp_path: Path) -> Path:
    state = started(run_config("asp"))
    mixed_pushes(state, 2)
    return saved(state, tmp_path)


def refused(config: RunConfig, path: Path, message: str, *, keys: KeyRange = KEYS,
            layout: KeyLayout = LAYOUT) -> None:
    """Restoring ``path`` into a fresh shard fails with exactly ``message`` (``{path}`` is
    filled in) and leaves the shard untouched."""
    target = fresh(config, keys, layout)
    before = fingerprint(target)
    with pytest.raises(StoreError) as caught:
        restore(target, path)
    assert str(caught.value) == message.format(path=path)
    assert fingerprint(target) == before
    assert not target.initialized


def test_a_file_of_a_shard_with_other_keys_is_refused(tmp_path: Path) -> None:
    config = run_config("asp", servers=2)
    single = KeyLayout.single(8)
    first = fresh(config, KeyRange(0, 4), single)
    first.init(KeyRange(0, 4), START[:4])
    path = saved(first, tmp_path)
    refused(config, path, "checkpoint {path} holds keys [0, 4), this shard [4, 8)",
            keys=KeyRange(4, 8), layout=single)
    refused(config, path, "checkpoint {path} does not fit this shard: params should have shape "
                          "(3,), has (4,) (was the run's config changed?)",
            keys=KeyRange(5, 8), layout=single)


def test_a_file_with_another_worker_count_is_refused(checkpointed: Path) -> None:
    refused(run_config("asp", workers=2), checkpointed,
            "checkpoint {path} does not fit this shard: next should have shape (2, 2), has "
            "(3, 2) (was the run's config changed?)")


def test_a_file_with_other_clock_ranges_is_refused(checkpointed: Path) -> None:
    refused(run_config("asp"), checkpointed,
            "checkpoint {path} does not fit this shard: next should have shape (3, 1), has "
            "(3, 2) (was the run's config changed?)", layout=KeyLayout.single(8))


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        ("adam", "slot1 should have shape (8,), has nothing"),
        ("sgd-momentum", None),  # the same slots: accepted
    ],
)
def test_a_file_of_another_optimizer_is_refused_by_its_slots(
        tmp_path: Path, optimizer: str, message: str | None) -> None:
    state = started(run_config("asp", optimizer="sgd-nesterov-decay"))
    path = saved(state, tmp_path)
    config = run_config("asp", optimizer=optimizer)
    if message is None:
        assert restore(fresh(config), path) == 1
    else:
        refused(config, path, "checkpoint {path} does not fit this shard: " + message
                + " (was the run's config changed?)")


@pytest.mark.parametrize("name", ["format", "seq", "keys", "params", "next", "versions",
                                  "pushes", "slot0"])
def test_a_file_missing_an_array_is_refused(checkpointed: Path, name: str) -> None:
    shapes = {"format": (1,), "seq": (1,), "keys": (2,), "params": (8,), "next": (3, 2),
              "versions": (2,), "pushes": (1,), "slot0": (8,)}
    bad = rewritten(checkpointed, lambda arrays: arrays.pop(name))
    refused(run_config("asp"), bad,
            f"checkpoint {{path}} does not fit this shard: {name} should have shape "
            f"{shapes[name]}, has nothing (was the run's config changed?)")


def test_a_file_with_a_misshapen_array_is_refused(checkpointed: Path) -> None:
    def reshape(arrays: dict[str, np.ndarray]) -> None:
        arrays["versions"] = np.zeros((2, 1), dtype=np.int64)

    refused(run_config("asp"), rewritten(checkpointed, reshape),
            "checkpoint {path} does not fit this shard: versions should have shape (2,), has "
            "(2, 1) (was the run's config changed?)")


@pytest.mark.parametrize(
    ("name", "value"),
    [("params", np.nan), ("params", np.inf), ("slot0", -np.inf), ("slot0", np.nan)],
)
def test_non_finite_values_are_refused(checkpointed: Path, name: str, value: float) -> None:
    def poison(arrays: dict[str, np.ndarray]) -> None:
        arrays[name][3] = value

    refused(run_config("asp"), rewritten(checkpointed, poison),
            "checkpoint {path} holds values that are not finite float32")


def test_values_that_are_not_float32_are_refused(checkpointed: Path) -> None:
    def widen(arrays: dict[str, np.ndarray]) -> None:
        arrays["params"] = arrays["params"].astype(np.float64)

    refused(run_config("asp"), rewritten(checkpointed, widen),
            "checkpoint {path} holds values that are not finite float32")


@pytest.mark.parametrize("name", ["next", "versions", "pushes", "seq"])
@pytest.mark.parametrize("kind", ["negative", "float", "unsigned", "bool"])
def test_negative_or_non_integer_counts_are_refused(checkpointed: Path, name: str,
                                                    kind: str) -> None:
    def replace(arrays: dict[str, np.ndarray]) -> None:
        shape = arrays[name].shape
        arrays[name] = {"negative": np.full(shape, -1, dtype=np.int64),
                        "float": np.full(shape, 1.0),
                        "unsigned": np.full(shape, 1, dtype=np.uint64),
                        "bool": np.full(shape, True)}[kind]

    refused(run_config("asp"), rewritten(checkpointed, replace),
            f"checkpoint {{path}} holds negative or non-integer {name}")


def test_a_negative_count_in_one_place_is_enough(checkpointed: Path) -> None:
    def one(arrays: dict[str, np.ndarray]) -> None:
        arrays["next"][2, 1] = -3

    refused(run_config("asp"), rewritten(checkpointed, one),
            "checkpoint {path} holds negative or non-integer next")


def test_another_format_is_refused(checkpointed: Path) -> None:
    def bump(arrays: dict[str, np.ndarray]) -> None:
        arrays["format"] = np.array([2], dtype=np.int64)

    refused(run_config("asp"), rewritten(checkpointed, bump),
            "checkpoint {path} has format 2, this psctl reads 1")


def test_a_file_holding_pickled_objects_is_refused_unread(tmp_path: Path) -> None:
    bad = tmp_path / "pickled.npz"
    np.savez(bad, params=np.array([{"evil": "payload"}], dtype=object))
    target = fresh(run_config("asp"))
    before = fingerprint(target)
    with pytest.raises(StoreError) as caught:
        restore(target, bad)
    assert str(caught.value) == (f"cannot read checkpoint {bad}: it holds Python objects, "
                                 "which psctl never loads; it is not a psctl checkpoint")
    assert fingerprint(target) == before
    assert not target.initialized


PYTHON_OBJECTS = "it holds Python objects, which psctl never loads; it is not a psctl checkpoint"
NEITHER = ("it is neither an archive of arrays (.npz) nor an array (damaged or not a "
           "checkpoint)")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "No data left in file (damaged or not a checkpoint)"),
        # anything that is neither npz nor npy is a pickle to numpy, but said for what it is
        (b"this is no checkpoint, just text\n" * 4, NEITHER),
        (random.Random(57).randbytes(4096), NEITHER),
        (pickle.dumps({"evil": "payload"}), PYTHON_OBJECTS),
        (b"\x93NUMPY garbage", "we only support format version (1,0), (2,0), and (3,0), not "
                               "(32, 103)"),
        (b"PK\x03\x04 half a zip", "File is not a zip file (damaged or not a checkpoint)"),
    ],
    ids=["empty", "text", "random", "pickle", "npy-garbage", "zip-garbage"],
)
def test_a_file_that_is_not_an_npz_is_refused(tmp_path: Path, content: bytes,
                                              reason: str) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(content)
    target = fresh(run_config("asp"))
    before = fingerprint(target)
    with pytest.raises(StoreError) as caught:
        restore(target, bad)
    assert str(caught.value) == f"cannot read checkpoint {bad}: {reason}"
    assert fingerprint(target) == before
    assert not target.initialized


def test_a_single_npy_array_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "shard-0.npz"
    with bad.open("wb") as handle:
        np.save(handle, START)
    target = fresh(run_config("asp"))
    with pytest.raises(StoreError, match=f"^cannot read checkpoint {re.escape(str(bad))}: "):
        restore(target, bad)
    assert not target.initialized


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    target = fresh(run_config("asp"))
    with pytest.raises(StoreError, match="^cannot read checkpoint .*shard-0.npz: "):
        restore(target, tmp_path / "shard-0.npz")
    assert not target.initialized


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncated-half", "File is not a zip file"),
        ("truncated-last-byte", "File is not a zip file"),
        ("flipped-data", "Bad CRC-32 for file 'params.npy'"),
    ],
)
def test_a_truncated_or_corrupted_checkpoint_is_a_store_error(checkpointed: Path, damage: str,
                                                              reason: str) -> None:
    data = bytearray(checkpointed.read_bytes())
    if damage == "truncated-half":
        data = data[: len(data) // 2]
    elif damage == "truncated-last-byte":
        data = data[:-1]
    else:
        with np.load(checkpointed) as arrays:
            params = arrays["params"].tobytes()
        at = data.find(params)
        assert at > 0
        data[at + 5] ^= 0xFF
    bad = checkpointed.with_name("damaged.npz")
    bad.write_bytes(data)
    target = fresh(run_config("asp"))
    before = fingerprint(target)
    with pytest.raises(StoreError) as caught:
        restore(target, bad)
    assert str(caught.value) == (f"cannot read checkpoint {bad}: {reason} (damaged or not a "
                                 "checkpoint)")
    assert fingerprint(target) == before
    assert not target.initialized


def test_clock_counts_of_another_type_are_refused_before_anything_is_copied(
        checkpointed: Path) -> None:
    def floats(arrays: dict[str, np.ndarray]) -> None:
        arrays["versions"] = arrays["versions"].astype(np.float64)

    refused(run_config("asp"), rewritten(checkpointed, floats),
            "checkpoint {path} holds negative or non-integer versions")


# -- atomic writes ----------------------------------------------------------------------------


def test_a_write_leaves_no_partial_file(tmp_path: Path) -> None:
    state = started(run_config("asp"))
    folder = tmp_path / "runs" / "abc" / "checkpoints"  # made on demand
    path = saved(state, folder, seq=1)
    assert sorted(p.name for p in folder.iterdir()) == ["shard-0.npz"]
    state.push(0, 0, KEYS, grad(0, 0))
    again = saved(state, folder, seq=2)  # replaces the first
    assert again == path
    assert sorted(p.name for p in folder.iterdir()) == ["shard-0.npz"]
    with np.load(path, allow_pickle=False) as data:
        assert int(data["seq"][0]) == 2
        assert data["params"].tobytes() == state.params.tobytes()


def test_a_snapshot_is_a_copy_taken_at_once(tmp_path: Path) -> None:
    state = started(run_config("asp"))
    snapshot = Snapshot.of(state, 9)
    taken = state.params.copy()
    state.push(0, 0, KEYS, grad(0, 0))  # after the snapshot: not in the file
    path = tmp_path / "shard-0.npz"
    assert snapshot.write(path) == path.stat().st_size
    with np.load(path, allow_pickle=False) as data:
        assert data["params"].tobytes() == taken.tobytes()
        assert data["next"].tolist() == [[0, 0]] * 3
        assert sorted(data.files) == ["finished", "format", "keys", "next", "params",
                                      "pushes", "seq", "slot0", "versions"]


def test_a_failed_write_keeps_the_previous_checkpoint_and_no_partial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = started(run_config("asp"))
    path = saved(state, tmp_path, seq=1)
    old = path.read_bytes()

    def disk_full(handle: Any, **arrays: Any) -> None:
        handle.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    state.push(0, 0, KEYS, grad(0, 0))
    with pytest.raises(StoreError) as caught:
        save(state, tmp_path, 0, 2)
    assert str(caught.value) == (f"cannot write checkpoint {path}: [Errno 28] No space left on "
                                 "device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-0.npz"]
    assert path.read_bytes() == old


def test_a_write_onto_a_folder_fails_cleanly(tmp_path: Path) -> None:
    state = started(run_config("asp"))
    (tmp_path / "shard-0.npz").mkdir()  # the final name is taken by a folder
    with pytest.raises(StoreError, match=r"^cannot write checkpoint .*shard-0\.npz: "):
        save(state, tmp_path, 0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-0.npz"]
    assert (tmp_path / "shard-0.npz").is_dir()


@pytest.mark.parametrize("below", [False, True])
def test_a_folder_path_that_is_a_file_is_a_store_error(tmp_path: Path, below: bool) -> None:
    state = started(run_config("asp"))
    blocker = tmp_path / "checkpoints"
    blocker.write_text("not a folder")
    folder = blocker / "run" if below else blocker
    try:
        save(state, folder, 0, 1)
    except StoreError as exc:
        assert str(exc).startswith(f"cannot write checkpoint {folder / 'shard-0.npz'}: ")
    except OSError as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}") from None
    assert blocker.read_text() == "not a folder"
    assert sorted(os.listdir(tmp_path)) == ["checkpoints"]


# -- damaged headers and clocks (issue 37): refused in one line, nothing allocated or replayed --


def forged(path: Path, name: str, shape: tuple[int, ...], dtype: str = "<i8") -> Path:
    """A copy of the npz at ``path`` whose array ``name`` has a header declaring ``shape`` over
    a few bytes of data, as a damaged or hostile file might."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": dtype, "fortran_order": False, "shape": shape})
    bad = path.with_name(f"forged-{path.name}")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(bad, "w") as target:
        for member in source.namelist():
            body = source.read(member)
            if member == f"{name}.npy":
                body = header.getvalue() + bytes(16)
            target.writestr(member, body)
    return bad


@pytest.mark.parametrize(("name", "shape"), [("params", (2**40,)), ("next", (2**31, 2**31)),
                                             ("slot0", (2**62,))])
def test_a_header_declaring_a_huge_shape_is_refused_before_allocating(
        checkpointed: Path, name: str, shape: tuple[int, ...]) -> None:
    import tracemalloc

    bad = forged(checkpointed, name, shape, dtype="<f4" if name != "next" else "<i8")
    target = fresh(run_config("asp"))
    tracemalloc.start()
    try:
        with pytest.raises(StoreError) as caught:
            restore(target, bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert message.startswith(f"checkpoint {bad} does not fit this shard: {name} should have "
                              f"shape ") and f"has {shape}" in message and "\n" not in message
    assert peak < 2**24  # numpy allocates what a header declares; it must not be asked to
    assert not target.initialized


def test_a_header_declaring_python_objects_is_refused_unread(checkpointed: Path) -> None:
    bad = forged(checkpointed, "versions", (2,), dtype="|O")
    with pytest.raises(StoreError) as caught:
        restore(fresh(run_config("asp")), bad)
    assert str(caught.value) == f"cannot read checkpoint {bad}: {PYTHON_OBJECTS}"
    assert "allow_pickle" not in str(caught.value)


def test_clocks_beyond_the_pushes_recorded_are_refused_without_replaying(
        checkpointed: Path) -> None:
    def far(arrays: dict[str, np.ndarray]) -> None:
        arrays["next"][0, 0] = 10**9  # replaying it would commit 10^9 clocks

    with np.load(checkpointed) as data:
        pushes = int(data["pushes"][0])
    refused(run_config("asp"), rewritten(checkpointed, far),
            f"checkpoint {{path}} holds clock 1000000000, more than the {pushes} pushes it "
            "records (damaged or not a checkpoint of this run)")
