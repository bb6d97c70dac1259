"""The worker loops by name: how a worker orders its pulls, computes and pushes
(``--loop``, config ``train.loop``). Implementations: ``engine.worker``, registered ``Lazy``.

``train.loop = "auto"`` picks what the run's settings need (``overlapped`` for ``train.overlap``,
``downpour`` for fetch_every / push_every / warm_start, ``scheduled`` for comm.schedule,
``delayed`` for bounded delay, ``sandblaster`` for the lbfgs optimizer, else ``plain``); any
other name is looked up here. A new loop is one class (usually a ``PlainLoop`` subclass) plus its
registration here, with the rules it needs of the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.consistency.registry import (
    CONSISTENCY_MODELS,
    OWN_DELAY,
    asynchronous,
    asynchronous_names,
)
from engine.models.kinds import MODELS, SPARSE_ROWS, trains_sparse_rows
from engine.policies.optimizers import DRIVES_TRAINING, SERVER_OPTIMIZERS
from engine.registry import Lazy, Registry

if TYPE_CHECKING:
    from engine.config import RunConfig


def _sparse(run: RunConfig) -> bool:
    from engine.datasets.sources import is_sparse_source

    return is_sparse_source(run.data.dataset)


def overlap_fits(run: RunConfig) -> None:
    """The overlapped loop computes while its next pull is in flight: only a model that answers
    every pull at once lets it (train.overlap or train.loop overlapped)."""
    model, loop = run.sync.model, run.train.loop
    if run.train.overlap and not asynchronous(run):
        raise ValueError(f"train.overlap needs {asynchronous_names()}; {model} must wait for "
                         "its pulls")
    if loop == "overlapped" and not asynchronous(run):
        raise ValueError(f"train.loop overlapped needs {asynchronous_names()}; {model} must "
                         "wait for its pulls")


def downpour_fits(run: RunConfig) -> None:
    """Downpour's fetch_every, push_every and warm_start are asynchronous settings of its own
    loop."""
    loop, model, train = run.train.loop, run.sync.model, run.train
    if train.downpour and not asynchronous(run):
        raise ValueError(f"train.fetch_every, push_every and warm_start are Downpour's "
                         f"asynchronous settings: they need sync.model {asynchronous_names()}, "
                         f"not {model}")
    if train.downpour and loop not in ("auto", "downpour"):
        raise ValueError(f"train.fetch_every, push_every and warm_start need the downpour "
                         f"loop (train.loop auto or downpour), not {loop}")
    if loop == "downpour" and not asynchronous(run):
        raise ValueError(f"train.loop downpour needs {asynchronous_names()}, not {model}")
    if train.downpour and train.overlap:
        raise ValueError("train.overlap and Downpour's fetch_every/push_every/warm_start "
                         "are two different loops: choose one")


def wait_free_fits(run: RunConfig) -> None:
    """Wait-free backpropagation pushes each layer from inside backward (train.layer_pulls
    sends its pulls from there too)."""
    loop = run.train.loop
    if loop == "wait-free" and (run.comm.prune != "none" or run.comm.momentum_correction):
        raise ValueError("train.loop wait-free pushes each layer from inside backward, but "
                         "comm.prune filters the whole gradient at once: use train.loop "
                         "layered (or plain) with a push filter")
    if run.train.layer_pulls and (loop != "wait-free" or not run.train.pipeline):
        raise ValueError("train.layer_pulls sends each layer's next pull from inside "
                         "backward: it needs train.loop wait-free and train.pipeline "
                         f"(here train.loop {loop}, train.pipeline {run.train.pipeline})")


def delayed_fits(run: RunConfig) -> None:
    """The delayed loop is bounded delay's (its servers apply pushes as asp's do)."""
    if not CONSISTENCY_MODELS.can(run.sync.model, OWN_DELAY):
        owners = " or ".join(CONSISTENCY_MODELS.able(OWN_DELAY))
        raise ValueError(f"train.loop {run.train.loop} does not fit sync.model "
                         f"{run.sync.model}: {owners} runs the delayed loop, and only it does")


def sparse_fits(run: RunConfig) -> None:
    """Sparse samples train in this loop, which has none of the dense loops' options."""
    sparse, loop = _sparse(run), run.train.loop
    if not sparse:
        if loop == "sparse":
            raise ValueError("train.loop sparse trains sparse data sets (sparse-synthetic:...)")
        return
    if not trains_sparse_rows(run.model.name):
        raise ValueError(f"sparse data sets train model {' or '.join(MODELS.able(SPARSE_ROWS))}, "
                         f"not {run.model.name}")
    comm, train = run.comm, run.train
    unsupported = [name for name, used in (
        ("train.loop " + loop, loop not in ("auto", "sparse")),
        ("train.overlap", train.overlap), ("train fetch_every/push_every/warm_start",
                                           train.downpour),
        ("comm.prune", comm.prune != "none"), ("comm.schedule", comm.schedule != "none"),
        ("comm.range_size", comm.range_size is not None)) if used]
    if unsupported:
        raise ValueError(f"the sparse logistic-regression loop does not take "
                         f"{', '.join(unsupported)}")


def sandblaster_fits(run: RunConfig) -> None:
    """This loop runs Sandblaster's tasks, which only its optimizer hands out."""
    if run.optimizer.name != "lbfgs":
        raise ValueError("train.loop sandblaster is Sandblaster L-BFGS's: it needs "
                         "optimizer.name lbfgs (--optimizer lbfgs)")


# The coordinator hands its workers portions of the whole training set (Sandblaster's tasks):
# each worker holds every row, not a shard of its own.
ANY_ROWS = "any-rows"
# (the worker, its model) -> the loop: a class of engine.worker (a PlainLoop, typed there)
LoopClass = Callable[..., Any]
WORKER_LOOPS: Registry[LoopClass] = Registry("worker loop")
WORKER_LOOPS.register("plain", Lazy("engine.worker.loops:PlainLoop"),
                      "pull, compute, push the whole model; the next pull leaves behind the push "
                      "(--no-pipeline: after its ack)")
WORKER_LOOPS.register("layered", Lazy("engine.worker.loops:LayeredLoop"),
                      "as plain, but one push per layer, last layer first, each its own clock")
WORKER_LOOPS.register("wait-free", Lazy("engine.worker.waitfree:WaitFreeLoop"),
                      "as layered, but each layer is pushed from inside backward as soon as its "
                      "gradient is ready (wait-free backpropagation)",
                      requires=(wait_free_fits,))
WORKER_LOOPS.register("overlapped", Lazy("engine.worker.loops:OverlappedLoop"),
                      "asp: prefetch the next pull while computing (staleness at least 1)",
                      requires=(overlap_fits,))
WORKER_LOOPS.register("delayed", Lazy("engine.worker.delayed:DelayedLoop"),
                      "bounded delay: up to --delay own iterations in flight",
                      requires=(delayed_fits,))
WORKER_LOOPS.register("downpour", Lazy("engine.worker.downpour:DownpourLoop"),
                      "asp: fetch every --fetch-every, push the sum every --push-every iterations",
                      requires=(downpour_fits,))
WORKER_LOOPS.register("scheduled", Lazy("engine.worker.scheduled:ScheduledLoop"),
                      "per-layer pulls and pushes through a request pool, in --schedule's order")
WORKER_LOOPS.register("sparse", Lazy("engine.worker.sparse:SparseLoop"),
                      "sparse logistic regression: pull and push each batch's working set, KKT "
                      "filter, bounded delay", requires=(sparse_fits,))
WORKER_LOOPS.register("sandblaster", Lazy("engine.worker.sandblaster:SandblasterLoop"),
                      "Sandblaster L-BFGS (--optimizer lbfgs): sum the loss and gradient over the "
                      "coordinator's data portions, push committed sums",
                      requires=(sandblaster_fits,), capabilities=frozenset({ANY_ROWS}))


def loop_name(config: RunConfig) -> str:
    if config.train.loop != "auto":
        return config.train.loop
    if _sparse(config):
        return "sparse"
    if SERVER_OPTIMIZERS.can(config.optimizer.name, DRIVES_TRAINING):
        return "sandblaster"
    if config.train.overlap:
        return "overlapped"
    if config.train.downpour:
        return "downpour"
    if config.comm.schedule != "none":
        return "scheduled"
    return "delayed" if CONSISTENCY_MODELS.can(config.sync.model, OWN_DELAY) else "plain"


def loops_in_use(config: RunConfig) -> tuple[str, ...]:
    """The loop the run trains in, and the loops whose settings it gives (whose rules must
    hold even where another loop was named: an overlap asked for and not run is a mistake)."""
    used = [loop_name(config)]
    for name, given in (("overlapped", config.train.overlap),
                        ("downpour", config.train.downpour),
                        ("wait-free", config.train.layer_pulls),
                        ("sparse", _sparse(config))):
        if given and name not in used:
            used.append(name)
    return tuple(used)
