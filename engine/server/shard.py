"""One shard's state and rules, free of I/O so that it can be tested directly.

The shard server (``engine.server.service``) wraps this with connections. A push goes through
four small policies in turn: ``RangeClocks`` (is this the worker's next clock on those ranges, or
a duplicate?), the consistency controller (when: may it be accepted, which rounds complete), the
aggregator (what: the scaled push, or a round's mean) and the optimizer (apply it to those keys
only). Hooks run after every applied update (replication, checkpoints and pull filters fit there).

Values are checked in the shard's float32, not in the sender's dtype: a float64 1e300 is finite on
the wire and infinite here. A pushed gradient whose squared norm overflows float32 (a norm above
about 1.8e19, far beyond any real gradient) is refused, and so is an update that would leave a
parameter or an optimizer slot non-finite: it is rolled back, so the parameters stay bit-identical.
A dense step whose optimizer bounds its result far from overflow (SGD: from the L2 norms of the
gradient, the parameters and the momentum) cannot be such an update, and runs with no copy.

A *sparse* shard (``SparseKeys``, issue 44) stores only the keys that were pushed: each gets a row
of the value and optimizer arrays when its first push arrives (``engine.keyrows``),
starting from its initial value, which a pull of a key never pushed also answers. Its keys are
pulled and pushed by key; the updates the optimizer and the aggregator see address rows, so every
optimizer works on it unchanged. It needs no INIT: it is initialised from the start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.consistency.base import NO_TIMING, ConsistencyController, PushTiming, RangeClocks
from engine.errors import BadPayload, ConfigError, ProtocolError, UnsafeUpdate
from engine.keyrows import MAP_BYTES_PER_KEY, KeyRows, RowBudget
from engine.keys import KeyRange, RangeIndex
from engine.policies.optimizers import ServerOptimizer
from engine.server.aggregation import Aggregator, make_aggregator
from engine.server.learning import PLAIN, Learning
from engine.server.optimizers import Proximal
from engine.server.update import Update
from engine.wire.codecs import widen
from engine.wire.protocol import ANY_CLOCK

UpdateHook = Callable[[Update], None]
# Far below float32's largest value (3.4e38): a step bounded by this cannot overflow, with room
# for the rounding of the float32 norms the bound is computed from.
SAFE_BOUND = 1e37
# Rows a sparse shard reserves by default: 2^28 keys (1 GiB of address space per float32 array,
# backed by memory only where written).
SPARSE_CAPACITY = 1 << 28


def zeros(keys: np.ndarray) -> np.ndarray:
    return np.zeros(len(keys), dtype=np.float32)


@dataclass(frozen=True)
class SparseKeys:
    """How a sparse shard stores its keys: at most ``capacity`` of them, each starting from
    ``initial(keys)`` (the keys' global ids -> float32 values; the same on every server), and
    no more than ``budget`` lets its process's sparse shards store in all."""

    capacity: int = SPARSE_CAPACITY
    initial: Callable[[np.ndarray], np.ndarray] = zeros
    budget: RowBudget | None = None


class ShardState:
    """Parameters for ``keys``, cut into clock ranges; each range counts its applied updates."""

    def __init__(
        self,
        keys: KeyRange,
        controller: ConsistencyController,
        optimizer: ServerOptimizer,
        *,
        workers: int = 1,
        ranges: list[KeyRange] | None = None,
        aggregator: Aggregator | None = None,
        clip_norm: float | None = None,
        learning: Learning = PLAIN,
        sparse: SparseKeys | None = None,
    ) -> None:
        self.keys = keys
        self.clip_norm = clip_norm
        self.learning = learning
        self.sparse = sparse
        self.rows: KeyRows | None = None  # a sparse shard's, once its arrays are made
        self.params = np.zeros(self.size, dtype=np.float32)
        self.index = RangeIndex(ranges or [keys])
        self.controller, self.optimizer = controller, optimizer
        if sparse is not None and len(self.index) != 1:
            raise ConfigError(f"a sparse shard is one clock range; [{keys.start}, {keys.end}) "
                              f"would hold {len(self.index)}")
        self.aggregator = aggregator or make_aggregator(
            "mean", keys, self.index.ranges, workers,
            sparse_capacity=None if sparse is None else sparse.capacity)
        if sparse is not None:
            self.rows = KeyRows(sparse.capacity, budget=sparse.budget,
                                row_bytes=self._row_bytes() + MAP_BYTES_PER_KEY)
        self.clocks = RangeClocks(workers, len(self.index))
        self.members = set(range(workers))  # the workers of the job now (psctl scale)
        self.departed: set[int] = set()
        self._rows = np.arange(workers)  # the members' rows of the clocks, in order
        self.finished = [False] * workers  # made their last push (a FINAL one)
        self.versions = np.zeros(len(self.index), dtype=np.int64)
        self.initialized = sparse is not None  # a sparse shard starts at its initial values
        self.pushes = 0
        self.hooks: list[UpdateHook] = []
        # The multiplier the last accepted push's gradient got on its way to the optimizer:
        # the aggregator's weight times the schedule's and the staleness rule's factors (a BSP
        # contribution: the factor its round will be applied with). None when it carried no
        # values. The ACK carries it back, so each iteration records its lr_scale.
        self.last_scale: float | None = None
        self._saved: list[np.ndarray] = []  # rollback buffers, one per array an update changes

    @property
    def size(self) -> int:
        """Rows of the shard's value arrays: its keys, or a sparse shard's capacity."""
        return len(self.keys) if self.sparse is None else self.sparse.capacity

    @property
    def stored(self) -> int:
        """Keys with a row: every key of a dense shard, the touched ones of a sparse one."""
        return len(self.keys) if self.rows is None else self.rows.used

    @property
    def stored_bytes(self) -> int:
        """Bytes the stored keys take: their rows of the value and optimizer arrays, and a
        sparse shard's key map (16 bytes a key); what its memory grows with."""
        return self.stored * self._row_bytes() + (0 if self.rows is None else self.rows.nbytes)

    def _row_bytes(self) -> int:
        """Bytes a key's row takes in the value and optimizer arrays."""
        arrays = (self.params, *self.optimizer.slots())
        return sum(a.itemsize for a in arrays if len(a) >= self.size)

    @property
    def version(self) -> int:
        """Updates every clock range has received (the slowest range's count)."""
        return int(self.versions.min())

    @property
    def duplicates(self) -> int:
        return self.clocks.duplicates

    def init(self, keys: KeyRange, values: np.ndarray) -> bool:
        """Set initial values; only the first complete initialisation counts. True if applied."""
        if self.sparse is not None:
            raise BadPayload("this shard's keys are sparse: each starts at its initial value "
                             "when first pushed, and no INIT is taken")
        if self.initialized:
            return False
        if keys != self.keys:
            raise BadPayload(
                f"INIT must cover the whole shard [{self.keys.start}, "
                f"{self.keys.end}), got [{keys.start}, {keys.end})"
            )
        with np.errstate(over="ignore"):
            values = np.asarray(values, dtype=self.params.dtype)
        if not np.isfinite(values).all():
            raise BadPayload("INIT values are not finite in the shard's float32")
        np.copyto(self.params, values)
        self.initialized = True
        return True

    def pull_ready(self, worker: int, clock: int, span: KeyRange | None = None) -> bool:
        if not self.initialized:
            return False
        ranges = self.index.touched(span or self.keys)
        return clock == ANY_CLOCK or self.controller.pull_ready(worker, clock, ranges)

    def version_of(self, span: KeyRange) -> int:
        """The newest version among the clock ranges ``span`` touches: under BSP every one of
        them is at the pulled clock, so a push's version minus its pull's is its staleness."""
        ranges = self.index.touched(span)
        return int(self.versions[ranges.start:ranges.stop].max()) if len(ranges) else 0

    def slowest_clock(self, span: KeyRange) -> int:
        """The clocks the slowest worker has committed on every clock range ``span`` touches:
        the servers' minimum layer clock, which a worker's push of the layer can advance only
        if it is that slowest worker."""
        ranges = self.index.touched(span)
        if not len(ranges):
            return 0
        if not len(self._rows):
            return 0
        return int(self.clocks.next[self._rows, ranges.start:ranges.stop].min())

    def join(self, worker: int) -> int:
        """A worker joins the running job at the clocks its consistency model gives it;
        returns the smallest."""
        if worker not in self.members:
            if worker in self.departed:
                raise ProtocolError(f"worker {worker} left this job; a rank is not used twice")
            self.clocks.add(worker, self.controller.join(worker))
            self.members.add(worker)
            self.finished += [False] * (self.clocks.workers - len(self.finished))
            self._rows = np.array(sorted(self.members), dtype=np.int64)
        return int(self.clocks.next[worker].min())

    def leave(self, worker: int) -> None:
        """A worker left after its last push: nobody waits for its later clocks."""
        if worker not in self.members:
            return
        self.controller.leave(worker, [int(c) for c in self.clocks.next[worker]])
        self.members.discard(worker)
        self.departed.add(worker)
        self._rows = np.array(sorted(self.members), dtype=np.int64)

    def worker_clock(self, worker: int, span: KeyRange) -> int:
        """The next clock ``worker`` may push on every clock range ``span`` touches (the
        smallest): the clocks it has committed there."""
        self._check_owned(span)
        self.clocks.check_rank(worker)
        ranges = self.index.touched(span)
        if not len(ranges):
            return 0
        return int(self.clocks.next[worker, ranges.start:ranges.stop].min())

    def check_readable(self, keys: KeyRange, index: np.ndarray | None) -> None:
        """Refuse (BadPayload) a pull this shard cannot answer, without reading it."""
        self._check_owned(keys)
        if self.rows is not None:
            self._keyed(index)

    def read(self, keys: KeyRange, index: np.ndarray | None = None) -> np.ndarray:
        self._check_owned(keys)
        if self.rows is not None:
            return self._read_rows(self._keyed(index))
        if isinstance(self.optimizer, Proximal):  # owes unpushed keys their penalty steps
            self.optimizer.bring_current(self.params, self.keys.local(keys),
                                         None if index is None else index - self.keys.start)
        if index is None:
            return self.params[self.keys.local(keys)]
        values: np.ndarray = self.params[index - self.keys.start]
        return values

    def read_keyed(self, keys: KeyRange, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, values) of the keys ``index``: their shard-local rows (int64; a sparse
        shard's stored rows, -1 where a key is not stored) and values, in one lookup."""
        if self.rows is None:
            return index.astype(np.int64) - self.keys.start, self.read(keys, index)
        self._check_owned(keys)
        rows = self.rows.find(index - self.keys.start)
        return rows, self._read_rows(index, rows)

    def _read_rows(self, index: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """A sparse shard's values of ``index`` (stored in ``rows`` if looked up already):
        stored rows, or the initial values."""
        assert self.rows is not None and self.sparse is not None
        if rows is None:
            rows = self.rows.find(index - self.keys.start)
        stored = rows >= 0
        if isinstance(self.optimizer, Proximal) and stored.any():
            self.optimizer.bring_current(self.params, slice(0, self.rows.used), rows[stored])
        values = np.empty(len(index), dtype=np.float32)
        values[stored] = self.params[rows[stored]]
        if not stored.all():
            initial = self.sparse.initial(index[~stored])
            values[~stored] = (self.optimizer.fresh(initial)
                               if isinstance(self.optimizer, Proximal) else initial)
        return values

    def _keyed(self, index: np.ndarray | None) -> np.ndarray:
        if index is None:
            raise BadPayload(f"keys [{self.keys.start}, {self.keys.end}) are sparse: they are "
                             "pulled and pushed by key, not as a range")
        return index

    def push(self, worker: int, clock: int, keys: KeyRange, grad: np.ndarray,
             timing: PushTiming = NO_TIMING, *, index: np.ndarray | None = None,
             commit: bool = True, base_version: int | None = None,
             trusted: bool = False) -> int:
        """Accept a gradient for ``keys`` (all of them, or the sorted keys ``index`` inside it);
        with ``commit`` the worker is done with ``clock`` on every clock range ``keys`` covers.
        ``base_version`` is the version of the pull the gradient was computed on (a PUSH frame
        carries it), which makes its staleness. Returns the version it was accepted at.
        Refused pushes change nothing. A ``trusted`` push was accepted by the chain's primary
        already: the consistency model's check is its (a copy that joined the chain later
        rebuilt its controller without the timing history, and must not refuse it)."""
        if not self.initialized:
            raise ProtocolError("push before the shard was initialised")
        self._check_owned(keys)
        ranges = self.index.touched(keys)
        if worker in self.departed:  # no one counts it any more: its push would skew them
            raise ProtocolError(f"worker {worker} has left this job")
        self.clocks.check(worker, clock, ranges)
        if not trusted:
            self.controller.check_push(worker, clock, ranges)
        if commit and self.index.covered(keys) != ranges:
            raise BadPayload(f"a commit must cover whole clock ranges; [{keys.start}, "
                             f"{keys.end}) cuts one: {self._describe(ranges)}")
        accepted_at = self.version_of(keys)
        staleness = max(0, accepted_at - base_version) if base_version is not None else 0
        self.last_scale = None
        if len(grad):
            update = self._local(keys, *self._gradient(grad), index, ranges)
            self.last_scale = self._contribute(update, worker, clock, staleness)
        self.pushes += 1
        if commit and len(ranges):
            self._commit(worker, clock, ranges, timing)
            if timing.final:
                self.finished[worker] = True
        return accepted_at

    def _gradient(self, grad: np.ndarray) -> tuple[np.ndarray, float]:
        """The pushed values in the shard's dtype and their L2 norm, refused when the norm is
        not finite there, and scaled down to ``clip_norm`` when it is set and exceeded."""
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is what is checked here
            values = widen(grad)
            # A float32 dot overflows when the squared norm does, and is NaN when a value is.
            squared = float(np.dot(values, values))
        if not np.isfinite(squared):
            raise BadPayload("pushed values are too large: their squared norm is not finite in "
                             "the shard's float32 (no gradient has a norm near 1.8e19)")
        norm = squared ** 0.5
        if self.clip_norm is not None and norm > self.clip_norm:
            return values * np.float32(self.clip_norm / norm), self.clip_norm * (1 + 1e-6)
        return values, norm

    def _contribute(self, update: Update, worker: int, clock: int, staleness: int) -> float:
        """Hand a push to the aggregator (and apply it, on arrival); returns its scale."""
        step = self._step(update)
        if self.controller.accumulates:
            self.aggregator.add(update)
            # The round is applied at this step with the schedule's factor alone.
            return self.aggregator.weight * self.learning.scale(step, clock=clock)
        scaled = self.aggregator.immediate(update)
        scale = self.learning.scale(step, (worker, staleness, scaled), clock=clock)
        if isinstance(self.optimizer, Proximal):  # a push is this share of one step
            self.optimizer.share = self.aggregator.weight
        self._apply(scaled, scale=scale)
        return self.aggregator.weight * scale

    def _step(self, update: Update) -> int:
        """Updates the keys of ``update`` have had: what a schedule is indexed by."""
        ranges = update.ranges
        return int(self.versions[ranges.start:ranges.stop].min()) if len(ranges) else 0

    def _commit(self, worker: int, clock: int, ranges: range, timing: PushTiming) -> None:
        complete = self.controller.on_commit(worker, clock, ranges)
        refused: list[str] = []
        if complete:
            if isinstance(self.optimizer, Proximal):  # a round is one step
                self.optimizer.share = 1.0
            for update in self.aggregator.release(complete):
                try:
                    self._apply(update, count=False,
                                scale=self.learning.scale(self._step(update), clock=clock))
                except UnsafeUpdate as exc:  # the round still completes, without this update
                    refused.append(str(exc))
            # One version per completed round, even for a range nobody pushed a key of.
            self.versions[complete] += 1
        if self.clocks.commit(worker, ranges):
            self.controller.on_clock(worker, clock, timing)
        if refused:
            raise UnsafeUpdate(f"the round this push completed was not applied: {refused[0]}")

    def _apply(self, update: Update, *, count: bool = True, scale: float = 1.0) -> None:
        if self._bounded(update, scale):
            self.optimizer.apply(self.params, update, scale)
        else:
            self._apply_checked(update, scale)
        if count:
            self.versions[update.ranges.start:update.ranges.stop] += 1
        for hook in self.hooks:
            hook(update)

    def _bounded(self, update: Update, scale: float) -> bool:
        """Whether the optimizer's bound proves a dense step leaves every value finite: then
        it runs in place with no copy to roll back to, and no check after (a 932k-key SGD
        step: the parameters' and the momentum's norms, 0.16 ms, the gradient's coming with
        the push, against two copies and two checks, 0.71 ms; bench/update.py)."""
        if update.index is not None:  # a sparse step's copies are as small as the step
            return False
        bound = self.optimizer.step_bound(self.params, update, scale)
        return bound is not None and bound < SAFE_BOUND

    def _apply_checked(self, update: Update, scale: float) -> None:
        arrays = (self.params, *self.optimizer.slots())
        saved = [self._snapshot(i, array, update) for i, array in enumerate(arrays)]
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            self.optimizer.apply(self.params, update, scale)
        if not all(np.isfinite(update.select(array)).all() for array in arrays):
            for array, before in zip(arrays, saved, strict=True):
                _restore(array, update, before)
            raise UnsafeUpdate("this update would make parameters non-finite; refused, "
                               "the parameters are unchanged")

    def _local(self, keys: KeyRange, grad: np.ndarray, norm: float, index: np.ndarray | None,
               ranges: range) -> Update:
        if self.rows is not None:
            rows = self._stored_rows(self._keyed(index))
            return Update(slice(0, self.rows.used), grad, rows, ranges, norm)
        span = self.keys.local(keys)
        if index is None:
            return Update(span, grad, None, ranges, norm)
        return Update(span, grad, index.astype(np.int64) - self.keys.start, ranges, norm)

    def _stored_rows(self, index: np.ndarray) -> np.ndarray:
        """The rows of a sparse push's keys, new ones stored at their initial values."""
        assert self.rows is not None and self.sparse is not None
        rows, new = self.rows.assign(index - self.keys.start)
        if new.any():
            self.params[rows[new]] = self.sparse.initial(index[new])
        return rows

    def _snapshot(self, slot: int, array: np.ndarray, update: Update) -> np.ndarray:
        """A copy of what ``update`` may change in ``array``; dense copies reuse one buffer per
        array, since fresh multi-megabyte copies cost page faults on every push."""
        if update.index is not None:
            picked: np.ndarray = array[update.index]
            return picked
        while len(self._saved) <= slot:
            self._saved.append(np.empty(self.size, dtype=np.float32))
        saved = self._saved[slot][: update.span.stop - update.span.start]
        np.copyto(saved, array[update.span])
        return saved

    def _describe(self, ranges: range) -> str:
        return ", ".join(f"[{self.index.ranges[r].start}, {self.index.ranges[r].end})"
                         for r in ranges)

    def _check_owned(self, keys: KeyRange) -> None:
        if not self.keys.contains(keys):
            raise BadPayload(
                f"keys [{keys.start}, {keys.end}) are not all on this shard, which "
                f"holds [{self.keys.start}, {self.keys.end})"
            )




def _restore(array: np.ndarray, update: Update, before: np.ndarray) -> None:
    if update.index is None:
        array[update.span] = before
    else:
        array[update.index] = before
