"""What a simulated run is built of: its data set, its model, the costs of its work on this
machine (``engine.sim.costs``), how each worker gets its model and how the evaluator is made,
built as a real run's roles build them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.config import RunConfig
from engine.datasets.sparse import SparseSplit
from engine.keys import KeyLayout
from engine.sim.costs import Costs
from engine.sim.runtime import VirtualClock

if TYPE_CHECKING:
    from engine.roles.evaluator import Measures
    from engine.worker.client import ParameterClient

MakeEvaluator = Callable[["ParameterClient", VirtualClock, Callable[[], None], float], "Measures"]


@dataclass
class Built:
    """What the run's data set and model give the simulation."""

    layout: KeyLayout
    costs: Costs
    initial: np.ndarray | None  # what worker 0 sends the servers; None: they start every key
    inputs: np.ndarray | SparseSplit  # the training set
    targets: np.ndarray
    update_keys: int  # the keys of the reference update (the ``simulated`` event's update_ms)
    seat: Callable[[], Any]  # a worker's model (its own place at a shared one, or rows)
    evaluator: MakeEvaluator  # the evaluator, on its client
    detail: dict[str, Any] = field(default_factory=dict)  # more for the ``simulated`` event


def build_model(config: RunConfig) -> Built:
    """The run's data, model and costs (measured where not cached: ``engine.sim.costs``)."""
    import scipy.linalg.blas  # noqa: F401  (loaded now, so that its threads are limited too)
    from threadpoolctl import threadpool_limits

    from engine.datasets.sources import is_sparse_source

    # As every role's process (the launcher gives it OMP_NUM_THREADS): the servers' BLAS on
    # train.torch_threads threads. OpenBLAS's own threads otherwise spin against the cores'
    # other work (a second simulation, say): a server's step took 10 ms instead of 0.3.
    threadpool_limits(limits=config.train.torch_threads)

    return (_sparse_model(config) if is_sparse_source(config.data.dataset)
            else _dense_model(config))


def calibrate(config: RunConfig) -> None:
    """Measure every cost the run's simulation needs and is not cached yet (``psctl study``,
    before it runs several simulations at once: a busy machine would time them slow)."""
    build_model(config)


def _dense_model(config: RunConfig) -> Built:
    import torch

    from engine.datasets import load_dataset
    from engine.models.flat import FlatModel, ModelSeat, calibration_sample
    from engine.roles.evaluator import Evaluator
    from engine.sim.costs import costs_for

    # As each worker process does: more intra-op threads than cores spin against each other.
    torch.set_num_threads(config.train.torch_threads)
    data_dir = Path(config.data.data_dir) if config.data.data_dir else None
    data = load_dataset(config.data.dataset, data_dir, train_limit=config.data.train_limit)
    model = FlatModel.for_run(config.model, data.spec, seed=config.train.seed)
    costs = costs_for(config, model, data.train_x, data.train_y, (data.test_x, data.test_y))
    # The evaluator's own model: it tests while the workers' gradients use the shared one.
    tested = FlatModel.for_run(config.model, data.spec, seed=config.train.seed)
    calibration = calibration_sample(tested, data.train_x, config.train.seed)
    test_x, test_y = torch.from_numpy(data.test_x), torch.from_numpy(data.test_y)

    def evaluator(client: ParameterClient, clock: VirtualClock, spend: Callable[[], None],
                  started_at: float) -> Measures:
        return Evaluator(tested, test_x, test_y, client, started_at, calibration, clock=clock,
                         spend=spend)

    return Built(model.layout, costs, model.params_np.copy(), data.train_x, data.train_y,
                 model.num_keys, lambda: ModelSeat(model), evaluator)


def _sparse_model(config: RunConfig) -> Built:
    """A model of sparse samples (engine.models.rows), as its workers and evaluator build it:
    no torch, no values held; the servers start every key (worker 0 sends no INIT unless the
    model gives initial values)."""
    from engine.datasets.sources import load_sparse
    from engine.models.rows import rows_model
    from engine.roles.evaluator import SparseEvaluator
    from engine.sim.costs import sparse_costs_for

    data = load_sparse(config.data.dataset, train_limit=config.data.train_limit,
                       hash_features=config.data.hash_features)
    model = rows_model(config.model, data.spec.input_dim)
    layout = model.layout()
    evaluation = model.evaluation(data.train, data.test, config.optimizer.l1)
    costs, update_keys = sparse_costs_for(config, model, layout, data.train, evaluation)

    def evaluator(client: ParameterClient, clock: VirtualClock, spend: Callable[[], None],
                  started_at: float) -> Measures:
        return SparseEvaluator(evaluation, client, started_at, clock=clock, spend=spend)

    return Built(layout, costs, model.initial_values(), data.train, data.train.labels,
                 update_keys, lambda: model, evaluator,
                 {"update_keys": update_keys, "update_of": "push of a batch's working set"})


def machine_cores(config: RunConfig) -> int:
    """The cores the simulated machine shares between the run's processes (0: none shared)."""
    if config.sim.costs == "given":
        return 0
    if config.sim.cores is not None:
        return config.sim.cores
    from engine.proctime import usable_cores

    return usable_cores()
