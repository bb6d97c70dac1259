"""The simulator's costs: the CPU time each piece of a run's work takes on this machine.

Every cost is measured on this machine, once, and cached (``cache_path()``), keyed by everything
that changes it, so that runs of the same configuration are identical (the simulator's
determinism); delete the file to measure again. The values a run used are recorded in its
``simulated`` event. They are CPU seconds of one core: the simulated machine shares its cores
between the run's processes (``engine.sim.cpu``), as a local run's processes share this one's.

- **a batch**: the real gradient step of the run's model and batch size, alone (one process, its
  torch threads): the median of several steps after a warm-up. The regime's ``compute_ms`` pads
  it, as it pads a real batch (``engine.worker.timing.Pace``);
- **a server's update**: a whole dense push through a shard as a server applies it (checks,
  rollback copy, the run's optimizer, finiteness check), per key; ``sim.server_ms`` gives it
  instead. A model of sparse samples has no dense update of the whole model (its key space may
  be 2^33 keys): its reference update is the push of one batch's working set, timed through
  shards built as the run's, and ``sim.server_ms`` given is that push's time;
- **moving a frame**: what sending and receiving a frame costs a worker's and a server's process
  per message and per byte, measured on the real data plane between two processes on the run's
  transport (``engine.sim.calibrate``);
- **an evaluation**: the evaluator's test of the model (its forward passes over the test set,
  or a model of sparse samples' measurement), alone.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.config import RunConfig
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.datasets.sparse import SparseSplit
    from engine.keys import KeyLayout
    from engine.models.flat import FlatModel
    from engine.models.rows import RowsEvaluation, RowsModel

WARMUP_STEPS = 3
TIMED_STEPS = 15
CALIBRATION_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Overheads:
    """What a real run's processes spend beyond the gradient and the update, on this machine
    (``engine.sim.calibrate``): a frame, to the process that sends it and the one that receives
    it, per message and per byte; a worker's loop, per iteration; the coordinator and the
    recorder, per row recorded; and ``contention``: how much more CPU a piece of work takes for
    each busy process per core beyond one (cache and switches: four busy processes on two cores
    make each second of work ``1 + contention`` seconds)."""

    worker_message_s: float
    server_message_s: float
    worker_send_byte_s: float
    worker_recv_byte_s: float
    server_recv_byte_s: float
    server_send_byte_s: float
    worker_iteration_s: float
    row_s: float
    contention: float

    def send_s(self, server: bool, nbytes: int) -> float:
        if server:
            return self.server_message_s + self.server_send_byte_s * nbytes
        return self.worker_message_s + self.worker_send_byte_s * nbytes

    def recv_s(self, server: bool, nbytes: int) -> float:
        if server:
            return self.server_message_s + self.server_recv_byte_s * nbytes
        return self.worker_message_s + self.worker_recv_byte_s * nbytes


# ``sim.costs given``: moving frames, rows and evaluations cost nothing.
FREE = Overheads(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Costs:
    """CPU seconds of work: a worker's batch, a server's update per key, moving frames, an
    evaluation."""

    compute_s: float
    update_s_per_key: float
    compute_measured: bool
    update_measured: bool
    overheads: Overheads
    evaluate_s: float

    def update_s(self, keys: int) -> float:
        return keys * self.update_s_per_key

    def as_detail(self, num_keys: int) -> dict[str, Any]:
        return {"compute_ms": self.compute_s * 1e3,
                "compute_measured": self.compute_measured,
                "update_ms": self.update_s(num_keys) * 1e3,
                "update_measured": self.update_measured,
                "evaluate_ms": self.evaluate_s * 1e3,
                "overheads": asdict(self.overheads)}


def cache_path() -> Path:
    """``$PSCTL_SIM_CACHE``, else ``$XDG_CACHE_HOME/psctl/sim-calibration.json``."""
    explicit = os.environ.get("PSCTL_SIM_CACHE")
    if explicit:
        return Path(explicit)
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "psctl" / "sim-calibration.json"


def costs_for(config: RunConfig, model: FlatModel, inputs: np.ndarray, targets: np.ndarray,
              test: tuple[np.ndarray, np.ndarray]) -> Costs:
    """The run's costs: given ones as given, the rest measured (or read from the cache)."""
    server_ms, num_keys = config.sim.server_ms, model.num_keys
    if config.sim.costs == "given":
        return given(config, num_keys)
    compute_s = _cached(_compute_key(config, model), lambda: _time_compute(
        model, inputs, targets, config.train.batch_size))
    if server_ms is not None:
        per_key = server_ms / 1e3 / num_keys
    else:
        per_key = _cached(_update_key(config, model), lambda: _time_update(config, num_keys))
    evaluate_s = _cached(f"evaluate|model={model.signature}|samples={len(test[1])}|threads="
                         f"{config.train.torch_threads}|torch={_torch_version()}",
                         lambda: _time_evaluation(model, *test))
    return Costs(compute_s, per_key, True, server_ms is None, overheads(config), evaluate_s)


def sparse_costs_for(config: RunConfig, model: RowsModel, layout: KeyLayout, train: SparseSplit,
                     evaluation: RowsEvaluation) -> tuple[Costs, int]:
    """A model of sparse samples' costs, and the keys of its reference update: the working set
    of one sample batch of the training set, whose gradient is timed for the compute cost and
    whose push for the update cost (per key, so that each push costs its own keys)."""
    server_ms = config.sim.server_ms
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(train), size=min(config.train.batch_size, len(train)), replace=False)
    batch = train.rows(np.sort(chosen))
    keys = model.working_set(batch)
    if config.sim.costs == "given":
        return given(config, len(keys)), len(keys)
    values = starting_values(layout, keys, config.train.seed)
    shape = _layout_key(layout)
    compute_s = _cached(_sparse_compute_key(config, shape), lambda: median_cpu_time(
        lambda: model.gradient(batch, keys, values)))
    if server_ms is not None:
        per_key = server_ms / 1e3 / len(keys)
    else:
        opt = config.optimizer
        per_key = _cached(f"sparse-push|layout={shape}|keys={len(keys)}|optimizer={opt.name}|"
                          f"momentum={opt.momentum:g}|l1={opt.l1:g}|data={config.data.dataset}",
                          lambda: _time_keyed_update(config, layout, keys))
    measured = starting_values(layout, evaluation.keys, config.train.seed)
    evaluate_s = _cached(f"sparse-evaluate|{_sparse_compute_key(config, shape)}|keys="
                         f"{len(evaluation.keys)}",
                         lambda: median_cpu_time(lambda: evaluation.measure(measured), steps=3))
    return Costs(compute_s, per_key, True, server_ms is None, overheads(config),
                 evaluate_s), len(keys)


def given(config: RunConfig, update_keys: int) -> Costs:
    """``sim.costs given``: the batch takes the regime's compute_ms (its floor: the gradient
    costs nothing of its own), the reference update ``sim.server_ms``; nothing else costs time
    (the plan refuses the setting without both)."""
    assert config.sim.server_ms is not None
    return Costs(0.0, config.sim.server_ms / 1e3 / update_keys, False, False, FREE, 0.0)


def overheads(config: RunConfig) -> Overheads:
    """What moving frames costs on the run's transport (``engine.sim.calibrate``, run once in
    processes of their own, with the roles' environment)."""
    transport = config.cluster.transport
    measured = _cached_table(overheads_key(transport), lambda: _calibrate(transport))
    try:
        return Overheads(**measured)
    except TypeError:
        raise ConfigError(f"the simulator's calibration cache {cache_path()} holds an entry of "
                          "another version for the wire's costs; delete it to measure "
                          "again") from None


def overheads_key(transport: str) -> str:
    """The calibration cache's key of the wire's costs on ``transport`` on this machine."""
    return (f"overheads|v3|transport={transport}|python={sys.version_info[:2]}|numpy="
            f"{np.__version__}|cores={os.cpu_count()}")


def _calibrate(transport: str) -> dict[str, float]:
    from engine.hosts import MALLOC_ENV

    command = [sys.executable, "-m", "engine.sim.calibrate", "--transport", transport]
    # Once per machine and transport: say why this first simulation takes half a minute.
    print(f"psctl: measuring what a local run's processes spend on this machine (once, about "
          f"40 s; cached in {cache_path()})", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=CALIBRATION_TIMEOUT_S, env={**os.environ, **MALLOC_ENV})
    except subprocess.TimeoutExpired:
        raise ConfigError(f"measuring the wire's costs took over {CALIBRATION_TIMEOUT_S:g} s "
                          f"({' '.join(command)})") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"measuring the wire's costs failed ({' '.join(command)}): {tail}")
    measured: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def starting_values(layout: KeyLayout, keys: np.ndarray, seed: int) -> np.ndarray:
    """The values the servers start the sorted ``keys`` from: each segment's rule, else 0."""
    from engine import initial

    values = np.zeros(len(keys), dtype=np.float32)
    for segment in layout.segments:
        lo, hi = np.searchsorted(keys, (segment.keys.start, segment.keys.end))
        if segment.init is not None and hi > lo:
            values[lo:hi] = initial.values(segment.init, keys[lo:hi], seed)
    return values


def _layout_key(layout: KeyLayout) -> str:
    return ";".join(f"{s.name}{list(s.shape)}{'s' if s.sparse else ''}{s.init or ''}"
                    for s in layout.segments)


def _sparse_compute_key(config: RunConfig, shape: str) -> str:
    data = config.data
    return (f"sparse-compute|layout={shape}|data={data.dataset}|limit={data.train_limit}|"
            f"hash={data.hash_features}|batch={config.train.batch_size}|numpy={np.__version__}")


def _time_keyed_update(config: RunConfig, layout: KeyLayout, keys: np.ndarray) -> float:
    """A push of ``keys`` (a working set) through shards of each kind built as the run's
    (sparse rows for sparse segments, a dense store else), as the servers handle it, per key."""
    import itertools

    from engine.consistency.base import ASP
    from engine.keys import partition, ranges_needed, split_keys_by_shard
    from engine.roles.copies import sparse_keys
    from engine.server.optimizers import make_optimizer
    from engine.server.shard import ShardState

    ranges = partition(layout, ranges_needed(layout))
    targets = []
    for index, mine in split_keys_by_shard(keys, ranges):
        span = ranges[index]
        sparse = sparse_keys(span, layout, config.train.seed) if layout.sparse_on(span) else None
        size = len(span) if sparse is None else sparse.capacity
        state = ShardState(span, ASP(1), make_optimizer(config.optimizer, size),
                           clip_norm=config.optimizer.clip_norm, sparse=sparse)
        if sparse is None:
            state.init(span, np.zeros(len(span), dtype=np.float32))
        targets.append((state, span, keys[mine]))
    clocks = itertools.count()

    def push() -> None:
        clock = next(clocks)
        for state, span, index in targets:
            state.push(0, clock, span, np.full(len(index), 1e-6, dtype=np.float32), index=index)

    return median_cpu_time(push) / len(keys)


def _compute_key(config: RunConfig, model: FlatModel) -> str:
    import torch

    return (f"compute|model={model.signature}|batch="
            f"{config.train.batch_size}|threads={config.train.torch_threads}|torch="
            f"{torch.__version__}")


def _update_key(config: RunConfig, model: FlatModel) -> str:
    opt = config.optimizer
    return (f"push|keys={model.num_keys}|optimizer={opt.name}|momentum="
            f"{opt.momentum:g}|nesterov={opt.nesterov}|weight_decay={opt.weight_decay:g}")


def _cached(key: str, measure: Callable[[], float]) -> float:
    value = _read_cache(cache_path()).get(key)
    if isinstance(value, int | float) and value > 0:
        return float(value)
    measured = measure()
    _store(key, measured)
    return measured


def _cached_table(key: str, measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    value = _read_cache(cache_path()).get(key)
    if isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
        return {k: float(v) for k, v in value.items()}
    measured = measure()
    _store(key, measured)
    return measured


def _store(key: str, value: float | dict[str, float]) -> None:
    path = cache_path()
    entries = _read_cache(path)  # again: another run may have added its own meanwhile
    entries[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(entries, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError as exc:
        raise ConfigError(f"cannot write the simulator's calibration cache {path}: {exc}; set "
                          "PSCTL_SIM_CACHE to a writable file, or give --compute-ms and "
                          "--server-ms") from None


def _read_cache(path: Path) -> dict[str, object]:
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the simulator's calibration cache {path} is unreadable ({exc}); "
                          "delete it to measure again") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"the simulator's calibration cache {path} is not a JSON object; "
                          "delete it to measure again")
    return loaded


def median_cpu_time(step: Callable[[], object], steps: int = TIMED_STEPS) -> float:
    """The median CPU time of ``step`` on this thread: what it costs, however busy the machine
    is (waiting for a core is the simulated machine's to model, engine.sim.cpu)."""
    for _ in range(WARMUP_STEPS):
        step()
    times = []
    for _ in range(steps):
        began = time.thread_time()
        step()
        times.append(time.thread_time() - began)
    return statistics.median(times)


def _time_compute(model: FlatModel, inputs: np.ndarray, targets: np.ndarray,
                  batch_size: int) -> float:
    from engine.models.flat import train_step_np

    rng = np.random.default_rng(0)
    batch = rng.choice(len(targets), size=min(batch_size, len(targets)), replace=False)
    saved = model.params_np.copy()
    try:
        return median_cpu_time(lambda: train_step_np(model, inputs[batch], targets[batch]))
    finally:
        np.copyto(model.params_np, saved)


def _time_update(config: RunConfig, num_keys: int) -> float:
    """A whole push through a shard as a server handles it (checks, rollback copy, optimizer,
    finiteness check), dense over ``num_keys``, per key."""
    import itertools

    from engine.consistency.base import ASP
    from engine.keys import KeyRange
    from engine.server.optimizers import make_optimizer
    from engine.server.shard import ShardState

    keys = KeyRange(0, num_keys)
    state = ShardState(keys, ASP(1), make_optimizer(config.optimizer, num_keys),
                       clip_norm=config.optimizer.clip_norm)
    state.init(keys, np.zeros(num_keys, dtype=np.float32))
    grad = np.full(num_keys, 1e-6, dtype=np.float32)
    clocks = itertools.count()
    return median_cpu_time(lambda: state.push(0, next(clocks), keys, grad)) / num_keys


def _time_evaluation(model: FlatModel, inputs: np.ndarray, targets: np.ndarray) -> float:
    """The evaluator's test of the model: its forward passes over the test set."""
    import torch

    from engine.models.flat import evaluate

    x, y = torch.from_numpy(inputs), torch.from_numpy(targets)
    return median_cpu_time(lambda: evaluate(model.module, x, y), steps=3)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
