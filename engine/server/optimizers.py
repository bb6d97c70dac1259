"""Server optimizers: how a shard applies an update to its parameters.

An update addresses a contiguous slice of the shard or a sorted list of its keys; an optimizer
touches only those keys' parameters and state (momentum, squared-gradient averages, step counts),
so a sparse push never moves a key nobody pushed. Optimizers are registered in
``engine.policies.optimizers`` by their config's name; docs/learning.md gives their formulas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.errors import ConfigError
from engine.policies.optimizers import SERVER_OPTIMIZERS, ServerOptimizer
from engine.server import kernels
from engine.server.update import Update

if TYPE_CHECKING:
    from engine.config import OptimizerConfig


class SGD:
    """SGD with optional (Nesterov) momentum and L2 weight decay, per key.

    The same update as ``torch.optim.SGD`` with dampening 0: buf = m * buf + g; p -= lr * buf.
    The buffer starts at zero, so a key's first step is buf = g, as torch seeds it.
    """

    def __init__(
        self,
        size: int,
        *,
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        fused: bool = True,
    ) -> None:
        if nesterov and momentum == 0:
            raise ConfigError("nesterov momentum needs momentum > 0")
        self.lr, self.momentum, self.nesterov = np.float32(lr), np.float32(momentum), nesterov
        self.weight_decay = np.float32(weight_decay)
        self._buf = np.zeros(size, dtype=np.float32) if momentum else None
        # Reused for every dense step: fresh 2 MB temporaries cost page faults on each update.
        self._scratch = np.empty(size, dtype=np.float32)
        # BLAS kernels for plain (heavy-ball) momentum; False keeps numpy's ops, the reference
        # that tests and bench/update.py compare them with.
        self.fused = fused and not nesterov and not weight_decay

    def apply(self, params: np.ndarray, update: Update, scale: float = 1.0) -> None:
        lr = self.lr * np.float32(scale)
        if update.index is not None:
            self._sparse(params, update.values, update.index, lr)
        elif self.fused:
            self._fused(params[update.span], update.values, update.span, lr)
        else:
            self._dense(params[update.span], update.values, update.span, lr)

    def slots(self) -> tuple[np.ndarray, ...]:
        return () if self._buf is None else (self._buf,)

    def step_bound(self, params: np.ndarray, update: Update, scale: float) -> float:
        # Every entry is at most its vector's L2 norm, so the step's terms bound it.
        weights = kernels.norm(params[update.span])
        grad = kernels.norm(update.values) if update.norm is None else update.norm
        direction = grad + float(self.weight_decay) * weights
        buf = 0.0
        if self._buf is not None:
            buf = float(self.momentum) * kernels.norm(self._buf[update.span]) + direction
            direction = direction + float(self.momentum) * buf if self.nesterov else buf
        return float(np.max([weights + float(self.lr) * scale * direction, buf]))  # NaN stays

    def _fused(self, params: np.ndarray, grad: np.ndarray, span: slice, lr: np.float32) -> None:
        """buf = m * buf + g; p -= lr * buf, in three in-place BLAS passes."""
        if self._buf is None:
            kernels.axpy(grad, params, -float(lr))
            return
        buf = self._buf[span]
        kernels.scal(float(self.momentum), buf)
        kernels.axpy(grad, buf, 1.0)
        kernels.axpy(buf, params, -float(lr))

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        """A dense step over the whole shard (the optimizer's original interface)."""
        self.apply(params, Update(slice(0, len(params)), grad))

    def _dense(self, params: np.ndarray, grad: np.ndarray, span: slice, lr: np.float32) -> None:
        scratch = self._scratch[: len(params)]
        direction = grad
        if self.weight_decay:
            direction = np.multiply(params, self.weight_decay, out=scratch)
            direction += grad
        if self._buf is not None:
            buf = self._buf[span]
            buf *= self.momentum
            buf += direction
            direction = direction + self.momentum * buf if self.nesterov else buf
        params -= np.multiply(direction, lr, out=scratch)

    def _sparse(self, params: np.ndarray, grad: np.ndarray, index: np.ndarray,
                lr: np.float32) -> None:
        direction = grad + self.weight_decay * params[index] if self.weight_decay else grad
        if self._buf is not None:
            buf = self.momentum * self._buf[index] + direction
            self._buf[index] = buf
            direction = direction + self.momentum * buf if self.nesterov else buf
        params[index] -= lr * direction


def _decayed(params: np.ndarray, grad: np.ndarray, weight_decay: np.float32,
             out: np.ndarray | None = None) -> np.ndarray:
    """The gradient with torch's L2 weight decay, g + wd * p (``grad`` itself when it is off:
    a pushed gradient can be a read-only view, so it is never written to)."""
    if not weight_decay:
        return grad
    decayed: np.ndarray = np.multiply(params, weight_decay, out=out)
    decayed += grad
    return decayed


class _Checked:
    """An optimizer with no bound on its step worked out (``ServerOptimizer.step_bound``): the
    shard copies what each step changes and checks the result."""

    def step_bound(self, params: np.ndarray, update: Update, scale: float) -> float | None:
        return None


class _Accumulating(_Checked):
    """An optimizer with one per-key accumulator of squared gradients (Adagrad, RMSprop): the
    dense and sparse bookkeeping they share; ``_step`` is each one's arithmetic."""

    DEFAULT_EPS = 1e-8

    def __init__(self, size: int, *, lr: float, weight_decay: float, eps: float | None) -> None:
        self.lr, self.weight_decay = np.float32(lr), np.float32(weight_decay)
        self.eps = np.float32(self.DEFAULT_EPS if eps is None else eps)
        self._acc = np.zeros(size, dtype=np.float32)
        # Reused by every dense step instead of fresh shard-sized temporaries (page faults).
        self._scratch = np.empty((2, size), dtype=np.float32)

    def apply(self, params: np.ndarray, update: Update, scale: float = 1.0) -> None:
        lr = self.lr * np.float32(scale)
        if update.index is None:
            n = update.span.stop - update.span.start
            self._step(params[update.span], update.values, self._acc[update.span], lr,
                       self._scratch[0, :n], self._scratch[1, :n])
        else:
            index = update.index
            acc, moved = self._acc[index], params[index]
            self._step(moved, update.values, acc, lr, None, None)
            self._acc[index], params[index] = acc, moved

    def slots(self) -> tuple[np.ndarray, ...]:
        return (self._acc,)

    def _step(self, params: np.ndarray, grad: np.ndarray, acc: np.ndarray, lr: np.float32,
              decayed: np.ndarray | None, work: np.ndarray | None) -> None:
        """One step on matching views or gathered copies; ``decayed`` and ``work`` are scratch
        (None: allocate, for a sparse step's small arrays)."""
        raise NotImplementedError


class Adagrad(_Accumulating):
    """Adagrad with L2 weight decay, per key: the same update as ``torch.optim.Adagrad`` with
    lr_decay 0 and initial_accumulator_value 0.

    sum += g * g; p -= lr * g / (sqrt(sum) + eps), with g = grad + weight_decay * p. The
    accumulator is per key, so a sparse push grows only its keys' sums: a rare key keeps a
    large step, which is why DistBelief's Downpour used it (Dean et al., NIPS 2012).
    """

    DEFAULT_EPS = 1e-10

    def __init__(self, size: int, *, lr: float, weight_decay: float = 0.0,
                 eps: float | None = None) -> None:
        super().__init__(size, lr=lr, weight_decay=weight_decay, eps=eps)

    def _step(self, params: np.ndarray, grad: np.ndarray, acc: np.ndarray, lr: np.float32,
              decayed: np.ndarray | None, work: np.ndarray | None) -> None:
        grad = _decayed(params, grad, self.weight_decay, decayed)
        square = np.multiply(grad, grad, out=work)
        acc += square
        denom = np.sqrt(acc, out=square)
        denom += self.eps
        step = np.divide(grad, denom, out=denom)
        step *= lr
        params -= step


class Adam(_Checked):
    """Adam with L2 weight decay, per key: the same update as ``torch.optim.Adam`` (amsgrad off,
    weight decay added to the gradient, not decoupled as in AdamW).

    m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g;
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).

    "Lazy" Adam with a step count t per key: a sparse push moves only its keys' m, v and t, so
    every key follows exactly the trajectory torch.optim.Adam would take on that key's own
    gradient subsequence, and a key nobody pushed neither drifts on stale momentum nor has its
    bias correction advanced. (torch's SparseAdam is lazy in m and v too, but counts one t for
    the whole tensor.) Under dense pushes all keys share t and this is torch.optim.Adam itself.
    """

    DEFAULT_EPS = 1e-8

    def __init__(self, size: int, *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.0, eps: float | None = None) -> None:
        self.lr, self.weight_decay = np.float32(lr), np.float32(weight_decay)
        self.beta1, self.beta2 = (float(beta) for beta in betas)
        self.eps = np.float32(self.DEFAULT_EPS if eps is None else eps)
        self._mean = np.zeros(size, dtype=np.float32)
        self._square = np.zeros(size, dtype=np.float32)
        # float32 like the other slots, since the shard's rollback copies are float32; counts
        # are exact to 2^24 steps, long after the bias corrections have reached 1.
        self._steps = np.zeros(size, dtype=np.float32)
        self._scratch = np.empty((2, size), dtype=np.float32)

    def apply(self, params: np.ndarray, update: Update, scale: float = 1.0) -> None:
        if update.index is None:
            span = update.span
            n = span.stop - span.start
            self._step(params[span], update.values, self._mean[span], self._square[span],
                       self._steps[span], scale, self._scratch[0, :n], self._scratch[1, :n])
        else:
            index = update.index
            mean, square, steps = self._mean[index], self._square[index], self._steps[index]
            moved = params[index]
            self._step(moved, update.values, mean, square, steps, scale, None, None)
            self._mean[index], self._square[index], self._steps[index] = mean, square, steps
            params[index] = moved

    def slots(self) -> tuple[np.ndarray, ...]:
        return (self._mean, self._square, self._steps)

    def _step(self, params: np.ndarray, grad: np.ndarray, mean: np.ndarray, square: np.ndarray,
              steps: np.ndarray, scale: float, decayed: np.ndarray | None,
              work: np.ndarray | None) -> None:
        grad = _decayed(params, grad, self.weight_decay, decayed)
        mean *= np.float32(self.beta1)
        mean += np.multiply(grad, np.float32(1 - self.beta1), out=work)
        square *= np.float32(self.beta2)
        squared = np.multiply(grad, grad, out=work)
        squared *= np.float32(1 - self.beta2)
        square += squared
        steps += 1
        step_size, root = self._corrections(steps, scale)
        denom = np.sqrt(square, out=squared)
        denom /= root
        denom += self.eps
        step = np.divide(mean, denom, out=denom)
        step *= step_size
        params -= step

    def _corrections(self, steps: np.ndarray,
                     scale: float) -> tuple[np.float32 | np.ndarray, np.float32 | np.ndarray]:
        """lr / (1 - b1^t) and sqrt(1 - b2^t): scalars when every key is at the same step (any
        dense-only run), else per key. In float64, as torch computes them: 1 - b2 in float32 is
        already 1e-5 off."""
        first = float(steps[0]) if len(steps) else 0.0
        t: float | np.ndarray = first if (steps == first).all() else steps.astype(np.float64)
        step_size = float(self.lr) * scale / (1 - self.beta1 ** t)
        root = np.sqrt(1 - self.beta2 ** t)
        if isinstance(t, float):
            return np.float32(step_size), np.float32(root)
        return np.asarray(step_size, dtype=np.float32), np.asarray(root, dtype=np.float32)


class RMSprop(_Accumulating):
    """RMSprop with L2 weight decay, per key: the same update as ``torch.optim.RMSprop`` with
    momentum 0 and centered off.

    s = alpha * s + (1 - alpha) * g * g; p -= lr * g / (sqrt(s) + eps). The config's
    ``momentum`` is SGD's (default 0.9) and is not used here: torch's RMSprop defaults to no
    momentum, and a momentum buffer on top of the running mean is a different optimizer.
    """

    def __init__(self, size: int, *, lr: float, alpha: float = 0.99, weight_decay: float = 0.0,
                 eps: float | None = None) -> None:
        super().__init__(size, lr=lr, weight_decay=weight_decay, eps=eps)
        self.alpha = np.float32(alpha)

    def _step(self, params: np.ndarray, grad: np.ndarray, acc: np.ndarray, lr: np.float32,
              decayed: np.ndarray | None, work: np.ndarray | None) -> None:
        grad = _decayed(params, grad, self.weight_decay, decayed)
        acc *= self.alpha
        squared = np.multiply(grad, grad, out=work)
        squared *= np.float32(1) - self.alpha
        acc += squared
        denom = np.sqrt(acc, out=squared)
        denom += self.eps
        step = np.divide(grad, denom, out=denom)
        step *= lr
        params -= step


class GradientSum(_Checked):
    """Sandblaster L-BFGS's servers (seed 004): pushes are summed into ``total`` and the
    parameters do not move. The coordinator's L-BFGS moves them, and reads the sum, through
    vector operations on the shard (engine.server.vectors), after each full pass."""

    def __init__(self, size: int) -> None:
        self.total = np.zeros(size, dtype=np.float32)

    def apply(self, params: np.ndarray, update: Update, scale: float = 1.0) -> None:
        # A schedule's factor would scale the gradient and break the line search's sums, so
        # the config refuses schedules for lbfgs; ``scale`` is 1 here.
        if update.index is None:
            self.total[update.span] += update.values
        else:
            self.total[update.index] += update.values  # sorted, unique keys

    def slots(self) -> tuple[np.ndarray, ...]:
        return (self.total,)


def build_sgd(config: OptimizerConfig, size: int) -> SGD:
    return SGD(size, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov,
               weight_decay=config.weight_decay)


def build_adagrad(config: OptimizerConfig, size: int) -> Adagrad:
    return Adagrad(size, lr=config.lr, weight_decay=config.weight_decay, eps=config.eps)


def build_adam(config: OptimizerConfig, size: int) -> Adam:
    return Adam(size, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
                eps=config.eps)


def build_rmsprop(config: OptimizerConfig, size: int) -> RMSprop:
    return RMSprop(size, lr=config.lr, alpha=config.alpha, weight_decay=config.weight_decay,
                   eps=config.eps)


def build_gradient_sum(config: OptimizerConfig, size: int) -> GradientSum:
    return GradientSum(size)


class Proximal(_Checked):
    """An L1 penalty applied as a proximal step (seed 003's sparse logistic regression): after
    the inner optimizer's step, each updated key is soft-thresholded by its own step size times
    ``l1``: p = sign(p) * max(|p| - rate * l1, 0). The penalty never enters the gradient, so
    weights reach exactly zero and stay there while |g| <= l1 (the KKT condition a worker's KKT
    filter tests to skip them). Only optimizers whose step is a per-key rate times the gradient
    have one: SGD without momentum (rate = lr) and Adagrad (rate = lr / (sqrt(sum) + eps)).

    Every update is one step of the stochastic method, and the penalty's step applies to every
    key at every step, pushed or not. A key nobody pushes has no loss gradient, so its steps are
    pure shrinkage, and such steps compose into one soft-threshold by the sum of their rates
    times l1 (exact: a key's own rate does not change while it is not pushed; the schedule's
    factor of each step is summed). They are taken lazily: a key's debt is settled when it is
    next updated or read (``bring_current``), so that pulls and checkpoints see current values.
    The running sum of the steps' factors, and each key's sum when it was last settled, are a
    slot; its last entry is the running sum itself.
    """

    def __init__(self, inner: SGD | Adagrad, l1: float, size: int) -> None:
        self.inner, self.l1 = inner, np.float32(l1)
        self._last = np.zeros(size + 1, dtype=np.float32)
        # What the next update counts for of one step of the method: a push applied on arrival
        # under the mean rule is 1/workers of one (its gradient was scaled so), and so is its
        # share of the penalty; the shard sets it (engine.server.shard).
        self.share = 1.0

    def apply(self, params: np.ndarray, update: Update, scale: float = 1.0) -> None:
        self._settle(params, update.span, update.index)
        self.inner.apply(params, update, scale)
        factor = np.float32(scale * self.share)
        self._shrink(params, update.index if update.index is not None else update.span, factor)
        self._last[-1] += factor
        self._mark(update.span, update.index)

    def bring_current(self, params: np.ndarray, span: slice, index: np.ndarray | None) -> None:
        self._settle(params, span, index)

    def slots(self) -> tuple[np.ndarray, ...]:
        return (*self.inner.slots(), self._last)

    def _settle(self, params: np.ndarray, span: slice, index: np.ndarray | None) -> None:
        where = span if index is None else index
        owed = self._last[-1] - self._last[:-1][where]
        if np.any(owed):
            self._shrink(params, where, owed)
        self._mark(span, index)

    def _mark(self, span: slice, index: np.ndarray | None) -> None:
        self._last[:-1][span if index is None else index] = self._last[-1]

    def fresh(self, values: np.ndarray) -> np.ndarray:
        """What keys never updated are now, from their initial ``values`` (a sparse shard's
        keys it does not store): every step so far was pure shrinkage for them, at the rate of
        a key with no state (Adagrad's sum 0), as a dense shard's unpushed keys are settled."""
        unmarked = np.zeros(len(values), dtype=np.float32)
        return self._soft(values, self._last[-1] - unmarked, self._rate(unmarked))

    def _shrink(self, params: np.ndarray, where: slice | np.ndarray,
                factors: np.float32 | np.ndarray) -> None:
        """Soft-threshold ``params[where]`` by lr * factors * l1 (per key for Adagrad)."""
        rate = self._rate(self.inner.slots()[0][where] if isinstance(self.inner, Adagrad)
                          else None)
        params[where] = self._soft(params[where], factors, rate)

    def _rate(self, sums: np.ndarray | None) -> np.float32 | np.ndarray:
        rate: np.float32 | np.ndarray = self.inner.lr
        if isinstance(self.inner, Adagrad):
            assert sums is not None
            rate = rate / (np.sqrt(sums) + self.inner.eps)
        return rate

    def _soft(self, values: np.ndarray, factors: np.float32 | np.ndarray,
              rate: np.float32 | np.ndarray) -> np.ndarray:
        shrunk: np.ndarray = np.sign(values) * np.maximum(
            np.abs(values) - factors * rate * self.l1, np.float32(0))
        return shrunk


def make_optimizer(config: OptimizerConfig, size: int) -> ServerOptimizer:
    optimizer = SERVER_OPTIMIZERS.get(config.name)(config, size)
    if not config.l1:
        return optimizer
    if (isinstance(optimizer, SGD) and not config.momentum) or isinstance(optimizer, Adagrad):
        return Proximal(optimizer, config.l1, size)
    raise ConfigError(f"optimizer.l1 (--l1) is a proximal step for sgd with --momentum 0 or for "
                      f"adagrad, not for {config.name}"
                      + (f" with momentum {config.momentum:g}" if config.name == "sgd" else ""))
