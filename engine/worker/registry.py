"""The worker loops by name: how a worker orders its pulls, computes and pushes.

``train.loop = "auto"`` picks what the run's settings need (``overlapped`` for ``train.overlap``,
``downpour`` for fetch_every / push_every / warm_start, ``scheduled`` for comm.schedule,
``delayed`` for bounded delay, ``sandblaster`` for the lbfgs optimizer, else ``plain``); any
other name is looked up here. A new loop is one class (usually a ``PlainLoop`` subclass) plus a
line here.
"""

from __future__ import annotations

from engine.config import RunConfig
from engine.datasets.sparse import is_sparse_synthetic
from engine.registry import Registry
from engine.worker.delayed import DelayedLoop, delayed_fits
from engine.worker.downpour import DownpourLoop, downpour_fits
from engine.worker.loops import LayeredLoop, OverlappedLoop, PlainLoop, overlap_fits
from engine.worker.sandblaster import SandblasterLoop, sandblaster_fits
from engine.worker.scheduled import ScheduledLoop
from engine.worker.sparse import SparseLoop, sparse_fits
from engine.worker.waitfree import WaitFreeLoop, wait_free_fits

WORKER_LOOPS: Registry[type[PlainLoop]] = Registry("worker loop")
WORKER_LOOPS.register("plain", PlainLoop,
                      "pull, compute, push the whole model; the next pull leaves behind the push "
                      "(--no-pipeline: after its ack)")
WORKER_LOOPS.register("layered", LayeredLoop,
                      "as plain, but one push per layer, last layer first, each its own clock")
WORKER_LOOPS.register("wait-free", WaitFreeLoop,
                      "as layered, but each layer is pushed from inside backward as soon as its "
                      "gradient is ready (wait-free backpropagation)",
                      requires=(wait_free_fits,))
WORKER_LOOPS.register("overlapped", OverlappedLoop,
                      "asp: prefetch the next pull while computing (staleness at least 1)",
                      requires=(overlap_fits,))
WORKER_LOOPS.register("delayed", DelayedLoop,
                      "bounded delay: up to --delay own iterations in flight",
                      requires=(delayed_fits,))
WORKER_LOOPS.register("downpour", DownpourLoop,
                      "asp: fetch every --fetch-every, push the sum every --push-every iterations",
                      requires=(downpour_fits,))
WORKER_LOOPS.register("scheduled", ScheduledLoop,
                      "per-layer pulls and pushes through a request pool, in --schedule's order")
WORKER_LOOPS.register("sparse", SparseLoop,
                      "sparse logistic regression: pull and push each batch's working set, KKT "
                      "filter, bounded delay", requires=(sparse_fits,))
WORKER_LOOPS.register("sandblaster", SandblasterLoop,
                      "Sandblaster L-BFGS (--optimizer lbfgs): sum the loss and gradient over the "
                      "coordinator's data portions, push committed sums",
                      requires=(sandblaster_fits,))


def loop_name(config: RunConfig) -> str:
    if config.train.loop != "auto":
        return config.train.loop
    if is_sparse_synthetic(config.data.dataset):
        return "sparse"
    if config.optimizer.name == "lbfgs":
        return "sandblaster"
    if config.train.overlap:
        return "overlapped"
    if config.train.downpour:
        return "downpour"
    if config.comm.schedule != "none":
        return "scheduled"
    return "delayed" if config.sync.model == "bounded-delay" else "plain"


def loops_in_use(config: RunConfig) -> tuple[str, ...]:
    """The loop the run trains in, and the loops whose settings it gives (whose rules must
    hold even where another loop was named: an overlap asked for and not run is a mistake)."""
    used = [loop_name(config)]
    for name, given in (("overlapped", config.train.overlap),
                        ("downpour", config.train.downpour),
                        ("wait-free", config.train.layer_pulls),
                        ("sparse", is_sparse_synthetic(config.data.dataset))):
        if given and name not in used:
            used.append(name)
    return tuple(used)
