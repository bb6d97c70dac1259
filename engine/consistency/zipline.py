"""ZipLine: where ElasticBSP places the next synchronisation barrier.

ElasticBSP (Zhao et al., ICDM 2019) lets workers run ahead of each other and synchronises them at a
future point chosen so that their waiting is smallest. ``times[i, j]`` is the predicted end time of
worker i's j-th next iteration (n workers, R iterations ahead, every row non-decreasing).
:func:`search` picks one iteration ``r[i]`` per worker so that the spread
``d = max_i times[i, r[i]] - min_i times[i, r[i]]`` (what the first finisher waits for the last) is
as small as possible. The barrier falls at the latest of the chosen end times.

The answer is fully determined, and every variant returns exactly the same ``(r, d)``:

1. ``d`` is the smallest spread over all R**n choices, each spread computed in float64 as
   ``max - min`` of the chosen times;
2. ``right``, the barrier, is the earliest: the smallest max among the choices of spread ``d``;
3. ``left`` is the largest min among the choices of spread ``d`` and max ``right``, that is the
   tightest window ending at ``right``: ``min_i`` of worker i's latest time ``<= right``;
4. each worker takes its earliest iteration inside ``[left, right]``: ``r[i]`` is the smallest j
   with ``times[i, j] >= left``. This ``r`` has min ``left`` and max ``right``, and it is the
   lexicographically smallest of the choices that do.

Rule 3 only matters under rounding: two windows with the same right end and different left ends
can have the same float64 spread; the tighter one wins, as it is the truly shorter wait.

Variants (all exact; ``DEFAULT_VARIANT`` is the fastest):

* ``"bucketed"``: the vectorized sweep on part of the candidates. They are cut into buckets of
  equal width in time; a bucket's earliest time gives an exact spread (so the smallest of those
  bounds the answer from above) and its latest time a lower bound for all of its candidates.
  Only the buckets that can still hold the answer, or a window tying it, are swept. O(nR) plus
  a sort of the buckets kept: few where the spread has a sharp minimum, as with workers of
  similar speed.
* ``"vectorized"``: for every candidate left end L (a time no later than the earliest last time,
  else some worker has no iteration left), the minimal right end is ``max_i`` of worker i's first
  time ``>= L``, which is the largest successor of any time ``< L`` (a worker's first iteration
  has no predecessor and always counts). One sort of the candidates and a running maximum of
  their successors give every right end at once: O(nR log(nR)) in numpy.
* ``"optbs"``: ZipLineOptBS as seed 001 describes it: ZipLineOpt's sweep, whose 'add' finds
  the new time's worker in the scanning set by binary search. The n x R matrix of predicted
  times says where that worker's element is: it holds the worker's previous time,
  ``times[i, j - 1]``, and the set is in time order, so ``bisect`` on the set's times finds it
  in O(log n) instead of ZipLine's linear search by worker. O(Rn log n) searches over the
  nR times (plus the sort that merges them); removing the element from a Python list is a
  memmove of the set's tail (C speed, bench/zipline.py measures the scaling in n).
* ``"rowbs"``: psctl's earlier reading of ZipLineOptBS, binary search in each worker's row, not
  in the scanning set: for every candidate L, a binary search in every worker's row finds its
  first time ``>= L``; the right end is their maximum. Vectorised over the candidates (one
  ``np.searchsorted`` per worker); the slowest workers go first, and after
  ``PRUNE_AFTER_WORKERS`` of them the candidates whose partial spread already exceeds a known
  window's are dropped. O(n C log R) for C candidates, before pruning.
* ``"zipline"``: the published sweep over all nR times merged in time order, keeping a scanning
  set of each worker's latest time in time order; each new time replaces its worker's older one
  (found by a linear search), and once every worker is present the window from the set's leftmost
  time to the new time is a candidate. O(nR log(nR) + n^2 R) in pure Python.
* ``"opt"``: ZipLineOpt, the same sweep, but when the new time belongs to the worker of the
  leftmost time that one is popped without a search; otherwise the leftmost time stays, the
  window can only grow, and it is not evaluated.
* ``"brute"``: every one of the R**n choices (at most ``MAX_BRUTE_COMBINATIONS``), for tests.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

Times = npt.NDArray[np.float64]
Choice = npt.NDArray[np.int64]
Window = tuple[float, float]  # (left, right): the chosen times lie in [left, right]

MAX_BRUTE_COMBINATIONS = 10**6
DEFAULT_VARIANT = "bucketed"  # the fastest (bench/zipline.py)


def search(times: np.ndarray, variant: str = DEFAULT_VARIANT) -> tuple[np.ndarray, float]:
    """The choice ``r`` (one future iteration per worker) of smallest spread, and the spread ``d``.

    ``times`` is an (n, R) array of predicted end times, every row non-decreasing. Raises
    ``ValueError`` on an unknown variant or on input that is not such an array.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known variants: {', '.join(VARIANTS)}")
    checked = _validated(times)
    if variant == "brute":
        return _brute(checked)
    left, _ = _WINDOW_FINDERS[variant](checked)
    return _assign(checked, left)


def _validated(times: np.ndarray) -> Times:
    array = np.ascontiguousarray(times, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"times must be 2-D (workers x iterations), got {array.ndim}-D")
    if array.size == 0:
        raise ValueError(f"times is empty (shape {array.shape}): need >= 1 worker and iteration")
    if not np.isfinite(array).all():
        raise ValueError("times contains NaN or inf")
    decreasing = array[:, 1:] < array[:, :-1]
    if decreasing.any():
        worker, j = (int(k) for k in np.unravel_index(np.argmax(decreasing), decreasing.shape))
        raise ValueError(
            f"times row {worker} decreases (times[{worker}, {j}] = {float(array[worker, j])!r} > "
            f"times[{worker}, {j + 1}] = {float(array[worker, j + 1])!r}); rows must be "
            "non-decreasing"
        )
    with np.errstate(over="ignore"):
        span = array.max() - array.min()
    if not np.isfinite(span):
        raise ValueError("times span more than float64 can hold (max - min overflows)")
    return array


def _first_at_or_after(times: Times, left: float) -> Choice:
    """Each worker's earliest iteration ending at or after ``left`` (rows are sorted)."""
    counts: np.ndarray = np.count_nonzero(times < left, axis=1).astype(np.int64)
    return counts


def _assign(times: Times, left: float) -> tuple[Choice, float]:
    """Rule 4: each worker's earliest time >= left; the spread of that choice."""
    choice = _first_at_or_after(times, left)
    chosen = times[np.arange(times.shape[0]), choice]
    return choice, float(chosen.max() - chosen.min())


def _tightest(lefts: Times, rights: Times) -> Window:
    """Rules 1-3, given candidate left ends and their minimal right ends, both non-decreasing."""
    first_best = int(np.argmin(rights - lefts))  # the first has the earliest right end
    right = rights[first_best]
    latest_same_right = int(np.searchsorted(rights, right, side="right")) - 1
    return float(lefts[latest_same_right]), float(right)


# -- vectorized -------------------------------------------------------------------------------


def _vectorized_window(times: Times) -> Window:
    last_left = times[:, -1].min()  # a later left end leaves some worker without an iteration
    flat = times.ravel()
    kept = np.flatnonzero(flat <= last_left)
    order = kept[np.argsort(flat[kept])]
    lefts = flat[order]
    # once L passes a time, its worker's next time (the next element of flat) becomes a
    # candidate for the right end. A worker's last time is only kept when it equals last_left,
    # the latest candidate, so what follows it in flat (another worker's) is never handed over.
    successors = flat[np.minimum(order + 1, flat.size - 1)]
    reach = np.maximum.accumulate(successors)
    run_starts = np.flatnonzero(np.concatenate(([True], lefts[1:] != lefts[:-1])))
    reach_of_earlier = np.concatenate(([-np.inf], reach))[run_starts]  # times strictly < L
    rights = np.maximum(reach_of_earlier, times[:, 0].max())  # first iterations always count
    return _tightest(lefts[run_starts], rights)


# -- bucketed -----------------------------------------------------------------------------------


BUCKET_SIZE = 4  # candidate left ends per bucket, on average


def _bucketed_window(times: Times) -> Window:
    """The vectorized sweep on a few buckets of candidates only.

    The candidates (times no later than the earliest last time) are cut into buckets of equal
    width in time; a bucket holds only times later than every earlier bucket's. For a left end
    L in bucket b, the right end is at least ``floor`` = max(first times, every successor of an
    earlier bucket's times), and exactly that at the bucket's earliest time: so each bucket
    gives an exact spread (``floor - earliest``), whose minimum U bounds the answer from above,
    and a lower bound for all its candidates (``floor - latest``). Only buckets whose lower
    bound is at most U can hold a window of the smallest spread, or one that ties it; the sweep
    runs on their candidates alone. Every step is monotone in float64, so the result is exactly
    the vectorized variant's.
    """
    last_left = times[:, -1].min()
    first_max = times[:, 0].max()
    successors = np.empty_like(times)
    successors[:, :-1] = times[:, 1:]
    successors[:, -1] = -np.inf  # only a last time equal to last_left is a candidate: it never
    keep = times <= last_left  # counts as "earlier" than any left end
    lefts, follow = times[keep], successors[keep]
    low = lefts.min()
    buckets = max(1, lefts.size // BUCKET_SIZE)
    width = (last_left - low) / buckets
    key = (np.zeros(lefts.size, dtype=np.int64) if width <= 0 else
           np.minimum(((lefts - low) / width).astype(np.int64), buckets - 1))
    latest = np.full(buckets, -np.inf)
    earliest = np.full(buckets, np.inf)
    reach = np.full(buckets, -np.inf)
    _scatter(np.maximum, latest, key, lefts)
    _scatter(np.minimum, earliest, key, lefts)
    _scatter(np.maximum, reach, key, follow)
    floor = np.maximum(np.concatenate(([-np.inf], np.maximum.accumulate(reach)[:-1])),
                       first_max)
    used = np.isfinite(earliest)
    upper = float((floor - earliest)[used].min())  # exact spreads: an upper bound on the answer
    hopeful = used & (floor - latest <= upper)
    chosen = hopeful[key]
    return _sweep(lefts[chosen], follow[chosen], floor[key[chosen]])


SCATTER_CHUNK = 1 << 16


def _scatter(ufunc: np.ufunc, out: np.ndarray, key: np.ndarray, values: Times) -> None:
    """``ufunc.at(out, key, values)`` in chunks: ``at`` holds the GIL throughout (10 ms at
    2.56 M values), and a search on a shard server's thread must let the loop in between."""
    for start in range(0, len(key), SCATTER_CHUNK):
        ufunc.at(out, key[start:start + SCATTER_CHUNK], values[start:start + SCATTER_CHUNK])


def _sweep(lefts: Times, follow: Times, floor: Times) -> Window:
    """The vectorized sweep over some candidates, each with the right-end floor its bucket
    gives (every successor of a time before the bucket)."""
    order = np.argsort(lefts, kind="stable")
    lefts, follow, floor = lefts[order], follow[order], floor[order]
    reach = np.maximum.accumulate(np.maximum(follow, floor))
    run_starts = np.flatnonzero(np.concatenate(([True], lefts[1:] != lefts[:-1])))
    earlier = np.concatenate(([-np.inf], reach))[run_starts]  # successors of times strictly < L
    return _tightest(lefts[run_starts], np.maximum(earlier, floor[run_starts]))


# -- binary search in each worker's row (psctl's earlier "optbs") -----------------------------


PRUNE_AFTER_WORKERS = 32


def _rowbs_window(times: Times) -> Window:
    lefts = np.unique(times[times <= times[:, -1].min()])  # sorted candidate left ends
    rights = np.full(lefts.shape, -np.inf)
    # the slowest workers first: their sparse times push the right ends furthest, so after a
    # few of them most candidates are already worse than a known window and can be dropped
    by_span = times[np.argsort(times[:, 0] - times[:, -1], kind="stable")]
    for row in by_span[:PRUNE_AFTER_WORKERS]:
        np.maximum(rights, row[np.searchsorted(row, lefts)], out=rights)
    spreads = rights - lefts  # lower bounds of the true spreads
    bound = _spread_from(times, float(lefts[int(np.argmin(spreads))]))
    # every candidate of spread <= bound survives, so rules 1-3 see all they need
    survivors = spreads <= bound
    lefts, rights = lefts[survivors], rights[survivors]
    for row in by_span[PRUNE_AFTER_WORKERS:]:
        np.maximum(rights, row[np.searchsorted(row, lefts)], out=rights)
    return _tightest(lefts, rights)


def _spread_from(times: Times, left: float) -> float:
    """The spread of the tightest window starting at ``left``, a candidate left end."""
    firsts = times[np.arange(times.shape[0]), _first_at_or_after(times, left)]
    return float(firsts.max() - left)


# -- ZipLine and ZipLineOpt: the sweep over merged times --------------------------------------


def _merged(times: Times) -> tuple[list[float], list[int]]:
    """All times in time order (ties by worker, then iteration) and the worker of each."""
    order = np.argsort(times, axis=None, kind="stable")
    return times.ravel()[order].tolist(), (order // times.shape[1]).tolist()


def _better(key: tuple[float, float, float], best: tuple[float, float, float] | None) -> bool:
    """Keys are (spread, right, -left): rules 1-3 as one lexicographic order."""
    return best is None or key < best


def _zipline_window(times: Times) -> Window:
    workers = times.shape[0]
    seen = [False] * workers
    scan_workers: list[int] = []  # the scanning set: each worker's latest time, in time order
    scan_times: list[float] = []
    best: tuple[float, float, float] | None = None
    for time, worker in zip(*_merged(times), strict=True):
        if seen[worker]:
            older = scan_workers.index(worker)  # the search step
            del scan_workers[older], scan_times[older]
        seen[worker] = True
        scan_workers.append(worker)
        scan_times.append(time)
        if len(scan_workers) == workers:
            key = (time - scan_times[0], time, -scan_times[0])
            if _better(key, best):
                best = key
    assert best is not None  # the last time completes the set
    return -best[2], best[1]


def _merged_with_iterations(times: Times) -> tuple[list[float], list[int], list[int]]:
    """As ``_merged``, with each time's iteration (its column in the matrix)."""
    order = np.argsort(times, axis=None, kind="stable")
    width = times.shape[1]
    return (times.ravel()[order].tolist(), (order // width).tolist(),
            (order % width).tolist())


# Where a worker's older element sits in the scanning set scan_*[head:]: (times, workers, head,
# the worker, the index of its new time in its row) -> position.
Locate = Callable[[list[float], list[int], int, int, int], int]


def _opt_sweep(times: Times, locate: Locate) -> Window:
    """ZipLineOpt's sweep over the merged times; ``locate`` is how 'add' finds the new time's
    worker in the scanning set (ZipLineOpt: a linear search by worker; ZipLineOptBS: a binary
    search by time)."""
    missing = times.shape[0]
    # the scanning set is scan_*[head:], in time order; popping the leftmost just moves head
    scan_workers: list[int] = []
    scan_times: list[float] = []
    head = 0
    best: tuple[float, float, float] | None = None
    for time, worker, iteration in zip(*_merged_with_iterations(times), strict=True):
        if iteration == 0:  # the worker's first time: it has no element in the set yet
            missing -= 1
            leftmost_changed = missing == 0  # the set is complete for the first time
        elif scan_workers[head] == worker:  # the leftmost time is the older one: no search
            head += 1
            leftmost_changed = True
        else:  # same leftmost, later right end: this window cannot beat the previous one
            older = locate(scan_times, scan_workers, head, worker, iteration)
            del scan_workers[older], scan_times[older]
            leftmost_changed = False
        scan_workers.append(worker)
        scan_times.append(time)
        if leftmost_changed and missing == 0:
            key = (time - scan_times[head], time, -scan_times[head])
            if _better(key, best):
                best = key
    assert best is not None
    return -best[2], best[1]


def _opt_window(times: Times) -> Window:
    def by_worker(scan_times: list[float], scan_workers: list[int], head: int, worker: int,
                  iteration: int) -> int:
        return scan_workers.index(worker, head)

    return _opt_sweep(times, by_worker)


def _optbs_window(times: Times) -> Window:
    """ZipLineOptBS (seed 001): the older element of the new time's worker is found by binary
    search on its time, read from the n x R matrix (the worker's previous iteration's)."""
    matrix = times.tolist()

    def by_time(scan_times: list[float], scan_workers: list[int], head: int, worker: int,
                iteration: int) -> int:
        # then a step over any earlier elements of the same time (other workers' ties)
        position = bisect.bisect_left(scan_times, matrix[worker][iteration - 1], head)
        while scan_workers[position] != worker:
            position += 1
        return position

    return _opt_sweep(times, by_time)


# -- brute force ------------------------------------------------------------------------------


def _brute(times: Times) -> tuple[Choice, float]:
    workers, width = times.shape
    total = width**workers
    if total > MAX_BRUTE_COMBINATIONS:
        raise ValueError(
            f"brute force needs R**n = {width}**{workers} choices, more than "
            f"{MAX_BRUTE_COMBINATIONS:,}"
        )
    # choice number k, written in base R with worker 0 as the most significant digit, so that
    # the numbering follows the lexicographic order of the choices
    numbers = np.arange(total)
    rights = np.full(total, -np.inf)
    lefts = np.full(total, np.inf)
    for worker in range(workers):
        chosen = times[worker, numbers // width ** (workers - 1 - worker) % width]
        np.maximum(rights, chosen, out=rights)
        np.minimum(lefts, chosen, out=lefts)
    spreads = rights - lefts
    best = spreads == spreads.min()
    best &= rights == rights[best].min()
    best &= lefts == lefts[best].max()
    number = int(np.argmax(best))  # the lexicographically first of the best choices
    digits = [number // width ** (workers - 1 - worker) % width for worker in range(workers)]
    choice = np.array(digits, dtype=np.int64)
    chosen_times = times[np.arange(workers), choice]
    return choice, float(chosen_times.max() - chosen_times.min())


_WINDOW_FINDERS: dict[str, Callable[[Times], Window]] = {
    "bucketed": _bucketed_window,
    "vectorized": _vectorized_window,
    "optbs": _optbs_window,
    "rowbs": _rowbs_window,
    "opt": _opt_window,
    "zipline": _zipline_window,
}
VARIANTS: tuple[str, ...] = (*_WINDOW_FINDERS, "brute")
