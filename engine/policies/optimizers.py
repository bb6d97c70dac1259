"""The server optimizers (``--optimizer``, config ``optimizer.name``): how a shard applies an
update. Implementations: ``engine.server.optimizers``; formulas: docs/learning.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from engine.registry import Lazy, Registry

if TYPE_CHECKING:
    import numpy as np

    from engine.config import OptimizerConfig, RunConfig
    from engine.server.update import Update


class ServerOptimizer(Protocol):
    def apply(self, params: np.ndarray, update: Update, scale: float = 1.0) -> None:
        """Update the keys of ``update`` in ``params`` (the whole shard, float32) in place, with
        the learning rate multiplied by ``scale`` for this update only (a schedule's factor
        times a staleness rule's: engine.server.learning)."""
        ...

    def slots(self) -> tuple[np.ndarray, ...]:
        """The per-key state arrays (shard-sized, like momentum buffers) that ``apply`` changes,
        so that the shard can roll an update back when it would leave them non-finite."""
        ...

    def step_bound(self, params: np.ndarray, update: Update, scale: float) -> float | None:
        """An upper bound on the absolute value of every parameter and slot entry a dense
        ``update`` changes, after its step (NaN or inf when a value before it is not finite).
        None when there is none worked out: the shard then copies what the step changes and
        checks the result, rolling it back if it is not finite (engine.server.shard)."""
        ...

# (settings, shard size) -> the shard's optimizer
OptimizerBuild = Callable[["OptimizerConfig", int], "ServerOptimizer"]
# The rate each uses when the run gives none (--lr): rates that suit one optimizer are far off
# for another.
LR = "optimizer.lr"
# The coordinator moves the parameters itself and hands the workers their tasks (Sandblaster
# L-BFGS): the run is named after the optimizer, and the coordinator runs its method.
DRIVES_TRAINING = "drives-training"
# It applies optimizer.momentum to what the workers push (a worker that keeps a momentum of its
# own, Deep Gradient Compression's momentum correction, has it counted twice).
SERVER_MOMENTUM = "server-momentum"
# Its step for a gradient g is -lr x scale x g (plus momentum, where it has one): a worker can
# apply its own update to its cached copy as the shard does (SSP's read-my-writes).
PLAIN_STEP = "plain-step"


def _l1_fits(run: RunConfig) -> None:
    """optimizer.l1 is a proximal step (class Proximal): only a per-key rate times the gradient
    has one."""
    opt = run.optimizer
    if opt.l1 and not ((opt.name == "sgd" and opt.momentum == 0) or opt.name == "adagrad"):
        extra = f" with momentum {opt.momentum:g} (add --momentum 0)" if opt.name == "sgd" else ""
        raise ValueError(f"l1 is a proximal step for sgd with momentum 0 or for adagrad, "
                         f"not for {opt.name}{extra}")


def _lbfgs_fits(run: RunConfig) -> None:
    """Sandblaster L-BFGS moves the parameters itself: nothing may scale, filter, delay or
    change the gradient sums its line search compares."""
    opt, comm, train, learning = run.optimizer, run.comm, run.train, run.learning
    loop = train.loop
    unsupported = [name for name, used in (
        ("sync.model " + run.sync.model, run.sync.model != "asp"),
        ("sync.push_scale " + run.sync.push_scale, run.sync.push_scale != "sum"),
        ("train.loop " + loop, loop not in ("auto", "sandblaster")),
        ("train.overlap", train.overlap),
        ("train fetch_every/push_every/warm_start", train.downpour),
        ("optimizer.weight_decay", opt.weight_decay > 0), ("optimizer.l1", opt.l1 > 0),
        ("optimizer.clip_norm", opt.clip_norm is not None),
        ("learning.schedule " + learning.schedule, learning.schedule != "constant"),
        ("learning.rule " + learning.rule, learning.rule != "none"),
        ("comm.prune", comm.prune != "none"), ("comm.pull_filter", comm.pull_filter != "none"),
        ("comm.schedule", comm.schedule != "none"),
        ("comm.range_size", comm.range_size is not None),
        ("comm.wire_dtype " + comm.wire_dtype, comm.wire_dtype != "float32"),
        ("cluster.replicas", run.cluster.replicas > 0),
        ("fault.checkpoint_every_s", run.fault.checkpoint_every_s is not None),
        ("cluster.backend sim", run.cluster.backend == "sim"),
        ("sparse data sets", _sparse(run)),
        ("stop.budget (its passes are --epochs)", run.stop.budget is not None),
    ) if used]
    if unsupported:
        raise ValueError(f"optimizer lbfgs (Sandblaster L-BFGS) does not take "
                         f"{', '.join(unsupported)}")


def _sparse(run: RunConfig) -> bool:
    from engine.datasets.sources import is_sparse_source

    return is_sparse_source(run.data.dataset)


SERVER_OPTIMIZERS: Registry[OptimizerBuild] = Registry("server optimizer")
SERVER_OPTIMIZERS.register(
    "sgd", Lazy("engine.server.optimizers:build_sgd"),
    "SGD with optional (Nesterov) momentum and weight decay, as torch.optim.SGD",
    requires=(_l1_fits,), implies={LR: 0.1},
    capabilities=frozenset({SERVER_MOMENTUM, PLAIN_STEP}))
SERVER_OPTIMIZERS.register(
    "adagrad", Lazy("engine.server.optimizers:build_adagrad"),
    "Adagrad, per-key sums of squared gradients, as torch.optim.Adagrad (Downpour's choice)",
    requires=(_l1_fits,),
    # torch's 0.01 reached 97.5 % on MNIST in one of two asp runs with 4 workers, 0.005 in
    # both and twice as fast (docs/learning.md): normalised steps ignore the 1/workers scale.
    implies={LR: 0.005})
SERVER_OPTIMIZERS.register(
    "adam", Lazy("engine.server.optimizers:build_adam"),
    "Adam with per-key step counts (lazy under sparse pushes), as torch.optim.Adam",
    requires=(_l1_fits,), implies={LR: 0.001})
SERVER_OPTIMIZERS.register(
    "rmsprop", Lazy("engine.server.optimizers:build_rmsprop"),
    "RMSprop without momentum, as torch.optim.RMSprop",
    requires=(_l1_fits,),
    implies={LR: 0.0005})  # 0.001 took 1.6-1.9x the iterations, with dips (docs/learning.md)
SERVER_OPTIMIZERS.register(
    "lbfgs", Lazy("engine.server.optimizers:build_gradient_sum"),
    "Sandblaster L-BFGS: the shards sum full-pass gradients, the coordinator's L-BFGS moves "
    "the parameters by vector operations on the shards; lr is each line search's first step",
    requires=(_lbfgs_fits,), capabilities=frozenset({DRIVES_TRAINING}),
    # its own tasks say when a push is applied: as they come, summed
    implies={LR: 1.0, "sync.model": "asp", "sync.push_scale": "sum"})


def default_lr(name: str) -> float:
    """The learning rate optimizer ``name`` runs at when the run gives none."""
    rate = SERVER_OPTIMIZERS.entry(name).implies[LR]
    assert isinstance(rate, float)
    return rate
