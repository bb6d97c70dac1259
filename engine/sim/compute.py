"""The compute model: how long a worker's batch and a server's update take in virtual time.

``sim.compute = "measured"`` times the real gradient step of the run's model and batch size on
this machine, alone (one process, its torch threads), once: the median of several steps after a
warm-up. A server's dense update of the whole model is timed the same way unless ``sim.server_ms``
gives it. Measurements are cached in a JSON file keyed by everything that changes them, so that
runs of the same configuration are identical (the simulator's determinism); delete the file to
measure again. The values a run used are recorded in its ``simulated`` event.

A model of sparse samples (``engine.models.rows``) has no dense update of the whole model (its key
space may be 2^33 keys): its reference update is the push of one batch's working set, timed
through shards built as the run's, and ``sim.server_ms`` given is that push's time.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.config import RunConfig
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.datasets.sparse import SparseSplit
    from engine.keys import KeyLayout
    from engine.models.flat import FlatModel
    from engine.models.rows import RowsModel

WARMUP_STEPS = 3
TIMED_STEPS = 15


@dataclass(frozen=True, slots=True)
class Costs:
    """Virtual seconds of work: a worker's batch, and a server's update per key."""

    compute_s: float
    update_s_per_key: float
    compute_measured: bool
    update_measured: bool

    def update_s(self, keys: int) -> float:
        return keys * self.update_s_per_key

    def as_detail(self, num_keys: int) -> dict[str, float | bool]:
        return {"compute_ms": self.compute_s * 1e3,
                "compute_measured": self.compute_measured,
                "update_ms": self.update_s(num_keys) * 1e3,
                "update_measured": self.update_measured}


def cache_path() -> Path:
    """``$PSCTL_SIM_CACHE``, else ``$XDG_CACHE_HOME/psctl/sim-calibration.json``."""
    explicit = os.environ.get("PSCTL_SIM_CACHE")
    if explicit:
        return Path(explicit)
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "psctl" / "sim-calibration.json"


def costs_for(config: RunConfig, model: FlatModel, inputs: np.ndarray,
              targets: np.ndarray) -> Costs:
    """The run's costs: given ones as given, the rest measured (or read from the cache)."""
    sim, num_keys = config.sim, model.num_keys
    compute_s = (sim.compute_ms / 1e3 if sim.compute_ms is not None
                 else _cached(_compute_key(config, model), lambda: _time_compute(
                     model, inputs, targets, config.train.batch_size)))
    if sim.server_ms is not None:
        per_key = sim.server_ms / 1e3 / num_keys
    else:
        per_key = _cached(_update_key(config, model), lambda: _time_update(config, num_keys))
    return Costs(compute_s, per_key, sim.compute_ms is None, sim.server_ms is None)


def sparse_costs_for(config: RunConfig, model: RowsModel, layout: KeyLayout,
                     train: SparseSplit) -> tuple[Costs, int]:
    """A model of sparse samples' costs, and the keys of its reference update: the working set
    of one sample batch of the training set, whose gradient is timed for the compute cost and
    whose push for the update cost (per key, so that each push costs its own keys)."""
    sim = config.sim
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(train), size=min(config.train.batch_size, len(train)), replace=False)
    batch = train.rows(np.sort(chosen))
    keys = model.working_set(batch)
    values = starting_values(layout, keys, config.train.seed)
    shape = _layout_key(layout)
    compute_s = (sim.compute_ms / 1e3 if sim.compute_ms is not None
                 else _cached(_sparse_compute_key(config, shape), lambda: _median_time(
                     lambda: model.gradient(batch, keys, values))))
    if sim.server_ms is not None:
        per_key = sim.server_ms / 1e3 / len(keys)
    else:
        opt = config.optimizer
        per_key = _cached(f"sparse-push|layout={shape}|keys={len(keys)}|optimizer={opt.name}|"
                          f"momentum={opt.momentum:g}|l1={opt.l1:g}|data={config.data.dataset}",
                          lambda: _time_keyed_update(config, layout, keys))
    return Costs(compute_s, per_key, sim.compute_ms is None, sim.server_ms is None), len(keys)


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

    return _median_time(push) / len(keys)


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
    path = cache_path()
    entries = _read_cache(path)
    value = entries.get(key)
    if isinstance(value, int | float) and value > 0:
        return float(value)
    value = measure()
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
    return value


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


def _median_time(step: Callable[[], object]) -> float:
    for _ in range(WARMUP_STEPS):
        step()
    times = []
    for _ in range(TIMED_STEPS):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _time_compute(model: FlatModel, inputs: np.ndarray, targets: np.ndarray,
                  batch_size: int) -> float:
    from engine.models.flat import train_step_np

    rng = np.random.default_rng(0)
    batch = rng.choice(len(targets), size=min(batch_size, len(targets)), replace=False)
    saved = model.params_np.copy()
    try:
        return _median_time(lambda: train_step_np(model, inputs[batch], targets[batch]))
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
    return _median_time(lambda: state.push(0, next(clocks), keys, grad)) / num_keys
