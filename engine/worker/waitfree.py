"""Wait-free backpropagation: each layer's gradient is pushed from inside backward.

The layered loop pushes one frame per layer, but only once backward has finished. Here an
autograd post-accumulate hook (``FlatModel.watch_gradients``) pushes a layer the moment its
gradient is complete, so the last layers travel while backward is still computing the first
ones (Poseidon's wait-free backpropagation, Zhang et al., 2017). The frames, their clocks and
what a consistency model sees are the layered loop's: only when each frame leaves changes.

``push`` is non-blocking (the client copies the values and hands the frame to its I/O thread), so
the hook costs backward one copy of the layer. A hook's failure (a stopping run, a closed link)
is kept and raised once backward is done, not through autograd. A worker slowed down by
``heterogeneity`` holds its pushes until its stretched compute phase ends, as in every other
loop: pushing early would hide the straggler it is meant to be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine import usermetrics
from engine.worker.client import PullHandle, PullResult, PushHandle
from engine.worker.loops import Host, LayeredLoop, Shard, compute_gradient

if TYPE_CHECKING:
    import numpy as np

    from engine.models.flat import FlatModel


class WaitFreeLoop(LayeredLoop):
    """The layered loop with each layer pushed from backward as soon as it is ready."""

    def __init__(self, worker: Host, model: FlatModel) -> None:
        super().__init__(worker, model)
        self._header: dict[str, Any] | None = None  # the clock's push header while armed
        self._sent: dict[int, PushHandle] = {}
        # With train.layer_pulls, each layer's pull of the next clock leaves right behind its
        # push: the servers answer the last layers while backward still computes the first.
        self._layer_pulls = worker.config.train.layer_pulls and self.pipelined
        self._ahead: dict[int, PullHandle] = {}
        self._ahead_clock: int | None = None
        self._first_at: float | None = None
        self._error: BaseException | None = None
        self._hold = worker.pace.active
        self._unwatch = model.watch_gradients(self._ready)

    def end(self) -> None:
        self._unwatch()
        ahead, self._ahead = self._ahead, {}
        self._forget(list(ahead.values()))
        super().end()

    def prepare(self, clock: int, pulled: PullResult, waited_s: float) -> None:
        self._header = {"clock": clock, "base_versions": pulled.versions, "waited_s": waited_s,
                        "final": clock == self.last_clock}
        self._sent, self._first_at, self._error = {}, None, None
        self._ahead_clock = (clock + 1 if self._layer_pulls and clock < self.last_clock
                             else None)

    def compute(self, shard: Shard, batch: np.ndarray) -> float:
        started = self.timer.perf()
        loss = compute_gradient(self.model, shard, batch, to_host=False)
        usermetrics.hold(self.worker.rank)
        self.worker.pace.computed(started)
        return loss

    def push(self, clock: int, pulled: PullResult,
             waited_s: float) -> tuple[list[PushHandle], float]:
        """The pushes backward sent, then any layer it did not (a held worker's, or a
        parameter the loss does not reach, whose gradient is zero), last layer first."""
        error, self._error = self._error, None
        if error is not None:
            self._header = None
            raise error
        for index in reversed(range(len(self.worker.layout.segments))):
            if index not in self._sent:
                self.model.segment_to_host(index)
                self._send(index)
        self._header = None
        assert self._first_at is not None  # a model has at least one segment
        return list(self._sent.values()), self._first_at

    def _ready(self, index: int) -> None:
        """From the autograd hook: push segment ``index`` now, unless held."""
        if self._header is None or self._hold or self._error is not None or index in self._sent:
            return
        try:
            self._send(index)
        except BaseException as exc:  # raised again by push, after backward
            self._error = exc

    def _send(self, index: int) -> None:
        assert self._header is not None
        keys = self.worker.layout.segments[index].keys
        pushed_at = self.timer.now()
        self._first_at = self._first_at or pushed_at
        self._sent[index] = self.client.push(keys, self.model.grads_np[keys.start:keys.end],
                                             pushed_at=pushed_at, **self._header)
        if self._ahead_clock is not None:
            # Backward is done with this layer's values (its gradient is complete), so the
            # answer may land in them now.
            self._ahead[index] = self.pull_range(keys, self._ahead_clock)

    def pull_ahead(self, clock: int) -> list[PullHandle]:
        """With ``train.layer_pulls``, the pulls each ``_send`` left behind its push (every
        layer has been sent); else one pull of the whole model."""
        if not self._layer_pulls:
            return super().pull_ahead(clock)
        ahead, self._ahead = self._ahead, {}
        assert clock == self._ahead_clock and len(ahead) == len(self.worker.layout.segments)
        return list(ahead.values())
