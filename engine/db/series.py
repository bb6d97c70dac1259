"""Read queries for the live dashboard: downsampled iteration series, deltas, syncs, events.

A run can hold millions of iteration rows, so charts never receive them one by one. Rows are
grouped by SQLite into time buckets of ``width`` seconds (counted from the run's start, by
``ended_at``) per worker; every aggregate kept per bucket (counts, sums, minima, maxima) can be
recomputed for any bucket from its rows alone, so a live view refreshes only the buckets that
new rows fell into. Spikes survive because minima and maxima are kept, never means alone.
Runs the recorder rolled up (``iteration_rollups``, 0.25 s slots) are bucketed from those
slots, which is what keeps a run page over a million rows fast; older runs from the rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select, text

from engine.db.clock import training_clock
from engine.db.queries import CRASH_AFTER_S as _CRASH_AFTER_S
from engine.db.queries import fetch_run, reading, run_summary
from engine.db.schema import (
    ROLLUP_WIDTH_S,
    evaluations,
    events,
    iterations,
    parse_json,
    runs,
    syncs,
)
from engine.db.stored import stored_keys

DEFAULT_BUCKETS = 1000
MIN_WIDTH_S = 0.25  # narrower buckets hold one iteration or none: rates would be all noise

# One row per (worker, bucket); asked per worker so that the primary key bounds each scan and
# several workers are aggregated at once on several cores (sqlite3 releases the GIL while it
# steps). Sums and extrema only, so a bucket can be rebuilt from its rows alone.
_BUCKETS_SQL = """
    SELECT worker, CAST((ended_at - :origin) / :width AS INTEGER) AS b,
           count(*) AS n, max(ended_at) AS t_last, max(iteration) AS it,
           sum(samples) AS samples, sum(compute_s) AS compute, sum(push_s) AS push,
           sum(pull_s) AS pull, sum(wait_s) AS wait,
           min(staleness) AS st_min, max(staleness) AS st_max,
           min(loss) AS loss_min, max(loss) AS loss_max,
           sum(bytes_sent) AS sent, sum(bytes_received) AS received,
           min(lr_scale) AS lr_min, max(lr_scale) AS lr_max,
           sum(push_bytes) AS pushed, sum(push_bytes_dense) AS pushed_dense,
           sum(pull_bytes_saved) AS pull_saved
    FROM iterations
    WHERE run_id = :run AND worker = :worker {since}
    GROUP BY b
"""
# A whole run is read along the primary key; a recent tail through (run_id, ended_at). Left to
# itself the planner picks the index for both, and a million lookups back into the table are
# three times slower than the sequential read.
_ALL_BUCKETS = text(_BUCKETS_SQL.format(since=""))
_TAIL_BUCKETS = text(_BUCKETS_SQL.format(since="AND ended_at >= :start"))
_SCAN_THREADS = 4

# The same buckets from the recorder's rollups (ROLLUP_WIDTH_S slots): a run of a million
# iterations has tens of thousands of rollup rows, so this reads those instead of the iterations
# (``:k`` is the width in slots; integer division groups them).
_ROLLUP_BUCKETS = text("""
    SELECT worker, slot / :k AS b, sum(n), max(last_ended_at), max(last_iteration),
           sum(samples), sum(compute_s), sum(push_s), sum(pull_s), sum(wait_s),
           min(staleness_min), max(staleness_max), min(loss_min), max(loss_max),
           sum(bytes_sent), sum(bytes_received), min(lr_min), max(lr_max),
           sum(push_bytes), sum(push_bytes_dense), sum(pull_bytes_saved)
    FROM iteration_rollups
    WHERE run_id = :run AND slot >= :start
    GROUP BY worker, b
""")
_ROLLUP_TOTALS = text("SELECT sum(n), max(last_ended_at) FROM iteration_rollups "
                      "WHERE run_id = :run")
_HAS_ROLLUPS = text("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                    "AND name = 'iteration_rollups'")

BUCKET_FIELDS = (
    "worker", "b", "n", "t_last", "it", "samples", "compute", "push", "pull", "wait",
    "st_min", "st_max", "loss_min", "loss_max", "sent", "received", "lr_min", "lr_max",
    "pushed", "pushed_dense", "pull_saved",
)


@dataclass(frozen=True)
class Buckets:
    """Per-worker time buckets: ``rows`` are tuples in ``BUCKET_FIELDS`` order."""

    origin: float  # bucket b covers [origin + b*width, origin + (b+1)*width)
    width: float
    rows: list[tuple[Any, ...]]
    total_rows: int  # iteration rows of the run (M in "showing N of M")

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "width": self.width, "fields": list(BUCKET_FIELDS),
                "rows": [list(r) for r in self.rows], "total_rows": self.total_rows}


def choose_width(span_s: float, buckets: int = DEFAULT_BUCKETS) -> float:
    """A bucket width giving at most ``buckets`` buckets over ``span_s``, rounded up to 1/2/5."""
    raw = max(span_s / max(1, buckets), MIN_WIDTH_S)
    scale = 10 ** math.floor(math.log10(raw))
    return float(next(m * scale for m in (1, 2, 5, 10) if m * scale >= raw * (1 - 1e-9)))


def iteration_buckets(
    engine: Engine,
    run_id: str,
    *,
    width: float | None = None,
    from_bucket: int = 0,
    since: float | None = None,
    buckets: int = DEFAULT_BUCKETS,
) -> Buckets:
    """The run's buckets from ``from_bucket`` on, or from the one holding ``since`` (unix s).

    Without ``width`` one is chosen so the whole run fits in about ``buckets`` buckets.
    """
    with reading(engine, f"reading series of run {run_id}") as conn:
        run = fetch_run(conn, run_id)
        origin, count, workers = float(run.started_at), int(run.iteration_count), run.workers
        rolled, last = _rollups(conn, run_id, count)
        if width is None:
            if not rolled:
                last = conn.execute(
                    select(func.max(iterations.c.ended_at)).where(iterations.c.run_id == run_id)
                ).scalar()
            width = choose_width((last or origin) - origin, buckets)
        if since is not None:
            from_bucket = max(from_bucket, math.floor((since - origin) / width))
        k = round(width / ROLLUP_WIDTH_S)
        if rolled and k >= 1 and math.isclose(k * ROLLUP_WIDTH_S, width):
            params = {"run": run_id, "k": k, "start": from_bucket * k}
            rows = sorted((tuple(r) for r in conn.execute(_ROLLUP_BUCKETS, params)),
                          key=lambda r: (r[1], r[0]))
            return Buckets(origin, width, rows, count)
    params = {"origin": origin, "width": width, "run": run_id,
              "start": origin + from_bucket * width}

    def scan(worker: int) -> list[tuple[Any, ...]]:
        with reading(engine, f"reading series of run {run_id}") as conn:
            sql = _TAIL_BUCKETS if from_bucket > 0 else _ALL_BUCKETS
            return [tuple(r) for r in conn.execute(sql, {**params, "worker": worker})]

    with ThreadPoolExecutor(max_workers=max(1, min(_SCAN_THREADS, workers))) as pool:
        rows = [row for part in pool.map(scan, range(workers)) for row in part]
    rows.sort(key=lambda r: (r[1], r[0]))
    return Buckets(origin, width, rows, count)


def _rollups(conn: Connection, run_id: str, count: int) -> tuple[bool, float | None]:
    """Whether the run's rollups account for every one of its rows, and its last end time.

    Runs recorded before rollups existed have none (nor, opened read-only, perhaps the table).
    """
    if count == 0 or conn.execute(_HAS_ROLLUPS).first() is None:
        return False, None
    total, last = conn.execute(_ROLLUP_TOTALS, {"run": run_id}).one()
    return total == count, last


# -- cheap change detection and cursors ----------------------------------------------------------


def run_marker(engine: Engine, run_id: str, now: float) -> dict[str, Any]:
    """A few indexed lookups that change whenever anything the dashboard shows changes."""
    with reading(engine, f"polling run {run_id}") as conn:
        summary = run_summary(fetch_run(conn, run_id), now, _CRASH_AFTER_S)
        eval_id = conn.execute(
            select(func.max(evaluations.c.id)).where(evaluations.c.run_id == run_id)
        ).scalar()
        event_id = conn.execute(
            select(func.max(events.c.id)).where(events.c.run_id == run_id)
        ).scalar()
        sync_state = conn.execute(
            select(func.count(), func.count(syncs.c.released_at)).where(syncs.c.run_id == run_id)
        ).one()
        return {"summary": summary.to_dict(), "iterations": summary.iterations,
                "eval_id": eval_id or 0, "event_id": event_id or 0,
                "syncs": [int(sync_state[0]), int(sync_state[1])]}


@dataclass(frozen=True)
class NewRows:
    """What arrived past per-worker cursors: the earliest end time, the new cursors, and the
    staleness counts of the new rows (exact, so a client can add them to its histogram)."""

    first_ended_at: float | None
    cursors: dict[int, int]
    staleness: list[tuple[int, int, int]]  # (worker, staleness, count)


def new_rows(engine: Engine, run_id: str, workers: int, cursors: dict[int, int]) -> NewRows:
    """Rows with an iteration number past ``cursors[worker]`` (primary-key range scans).

    Cursors rather than times: a worker's rows are committed in iteration order, but rows of
    different workers are not committed in end-time order, so a time cursor could miss some.
    """
    it = iterations.c
    first: float | None = None
    moved = dict(cursors)
    counts: list[tuple[int, int, int]] = []
    with reading(engine, f"reading new rows of run {run_id}") as conn:
        for worker in range(workers):
            after = cursors.get(worker, -1)
            where = (it.run_id == run_id, it.worker == worker, it.iteration > after)
            span = select(func.min(it.ended_at), func.max(it.iteration)).where(*where)
            head = conn.execute(span).one()
            if head[1] is None:
                continue
            moved[worker] = int(head[1])
            first = head[0] if first is None else min(first, head[0])
            hist = select(it.staleness, func.count()).where(*where).group_by(it.staleness)
            counts.extend((worker, int(s), int(n)) for s, n in conn.execute(hist))
    return NewRows(first, moved, counts)


def staleness_histogram(
    engine: Engine, run_id: str, upto: dict[int, int] | None = None
) -> list[tuple[int, int, int]]:
    """(worker, staleness, count), over the whole run or up to per-worker iteration cursors."""
    it = iterations.c
    if upto is None:
        with reading(engine, f"reading run {run_id}") as conn:
            workers = int(fetch_run(conn, run_id).workers)
        upto = {w: 2**62 for w in range(workers)}

    def scan(worker: int) -> list[tuple[int, int, int]]:
        stmt = (select(it.staleness, func.count())
                .where(it.run_id == run_id, it.worker == worker, it.iteration <= upto[worker])
                .group_by(it.staleness).order_by(it.staleness))
        with reading(engine, f"reading staleness of run {run_id}") as conn:
            return [(worker, int(s), int(n)) for s, n in conn.execute(stmt)]

    with ThreadPoolExecutor(max_workers=max(1, min(_SCAN_THREADS, len(upto)))) as pool:
        return [row for part in pool.map(scan, sorted(upto)) for row in part]


def worker_cursors(engine: Engine, run_id: str, workers: int) -> dict[int, int]:
    """The highest iteration recorded per worker (index lookups), -1 for none yet."""
    it = iterations.c
    with reading(engine, f"reading cursors of run {run_id}") as conn:
        out = {}
        for worker in range(workers):
            top = conn.execute(select(func.max(it.iteration))
                               .where(it.run_id == run_id, it.worker == worker)).scalar()
            out[worker] = -1 if top is None else int(top)
        return out


def last_points(engine: Engine, run_id: str, workers: int) -> list[dict[str, Any]]:
    """Each worker's latest raw row, so the newest value is shown even inside a bucket."""
    it = iterations.c
    cols = (it.worker, it.iteration, it.ended_at, it.loss, it.staleness, it.lr_scale)
    with reading(engine, f"reading last points of run {run_id}") as conn:
        found = []
        for worker in range(workers):
            row = conn.execute(select(*cols).where(it.run_id == run_id, it.worker == worker)
                               .order_by(it.iteration.desc()).limit(1)).first()
            if row is not None:
                found.append(dict(row._mapping))
        return found


# -- small tables: evaluations, events, syncs ----------------------------------------------------


def evaluations_since(engine: Engine, run_id: str, after_id: int = 0) -> list[dict[str, Any]]:
    ev = evaluations.c
    stmt = (select(ev.id, ev.at, ev.elapsed_s, ev.step, ev.epoch, ev.accuracy, ev.loss)
            .where(ev.run_id == run_id, ev.id > after_id).order_by(ev.at, ev.id))
    with reading(engine, f"reading evaluations of run {run_id}") as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def events_since(engine: Engine, run_id: str, after_id: int = 0) -> list[dict[str, Any]]:
    ec = events.c
    stmt = (select(ec.id, ec.at, ec.kind, ec.detail)
            .where(ec.run_id == run_id, ec.id > after_id).order_by(ec.id))
    with reading(engine, f"reading events of run {run_id}") as conn:
        return [{**dict(r._mapping), "detail": parse_json(r.detail)} for r in conn.execute(stmt)]


_SYNC_JSON = ("base_clocks", "predicted", "chosen", "barrier_clocks", "arrivals")


def syncs_from(engine: Engine, run_id: str, from_index: int = 0) -> list[dict[str, Any]]:
    """ElasticBSP barriers from ``from_index`` on (none for other consistency models)."""
    sc = syncs.c
    stmt = (select(syncs).where(sc.run_id == run_id, sc.sync_index >= from_index)
            .order_by(sc.sync_index))
    with reading(engine, f"reading syncs of run {run_id}") as conn:
        return [_sync_dict(dict(r._mapping)) for r in conn.execute(stmt)]


def _sync_dict(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("run_id", None)
    for key in _SYNC_JSON:
        if row.get(key) is not None:
            row[key] = json.loads(row[key])
    return row


def recent_iterations(engine: Engine, run_id: str, *, seconds: float = 10.0,
                      limit: int = 3000) -> list[dict[str, Any]]:
    """Raw iterations of the last ``seconds`` before the newest one (the timeline's window)."""
    it = iterations.c
    with reading(engine, f"reading recent iterations of run {run_id}") as conn:
        last = conn.execute(select(func.max(it.ended_at)).where(it.run_id == run_id)).scalar()
        if last is None:
            return []
        stmt = (select(it.worker, it.iteration, it.started_at, it.ended_at, it.compute_s,
                       it.push_s, it.pull_s, it.wait_s, it.staleness)
                .where(it.run_id == run_id, it.ended_at >= last - seconds)
                .order_by(it.ended_at.desc()).limit(limit))
        return [dict(r._mapping) for r in conn.execute(stmt)][::-1]


def run_header(engine: Engine, run_id: str, now: float) -> dict[str, Any]:
    """Summary, reason and resolved config of one run, its clock and the keys its servers
    stored, without scanning its iterations."""
    with reading(engine, f"reading run {run_id}") as conn:
        row = fetch_run(conn, run_id)
        return {"summary": run_summary(row, now, _CRASH_AFTER_S).to_dict(), "reason": row.reason,
                "config": parse_json(row.config_json),
                "clock": clock(conn, run_id, float(row.started_at)),
                "stored": _stored(conn, run_id)}


def run_stored(engine: Engine, run_id: str) -> dict[str, Any] | None:
    """The keys the run's servers stored (:mod:`engine.db.stored`), None while none has said;
    a live view asks again when a server's ``server_stats`` arrives."""
    with reading(engine, f"reading the stored keys of run {run_id}") as conn:
        return _stored(conn, run_id)


def _stored(conn: Connection, run_id: str) -> dict[str, Any] | None:
    found = stored_keys(conn, run_id)
    return None if found is None else found.to_dict()


def run_clock(engine: Engine, run_id: str) -> dict[str, Any]:
    """:func:`clock` in a transaction of its own (a live view asks again as rows come)."""
    with reading(engine, f"reading the clock of run {run_id}") as conn:
        started = conn.execute(select(runs.c.started_at).where(runs.c.id == run_id)).scalar()
        return clock(conn, run_id, float(started or 0.0))


def clock(conn: Connection, run_id: str, started_at: float) -> dict[str, Any]:
    """What a chart's time axis counts from: the run's clock (engine/db/clock.py), the first
    iteration's start (None before it), the start-up before it and a resumed run's downtime
    spans. One primary-key lookup per worker, never a scan of the run's rows."""
    return training_clock(conn, run_id, started_at).to_dict()


# -- full fidelity -------------------------------------------------------------------------------

ITERATION_COLUMNS = tuple(c.name for c in iterations.c if c.name != "run_id")


def iter_iterations(engine: Engine, run_id: str, batch: int = 5000) -> Iterator[tuple[Any, ...]]:
    """Every iteration row of a run in primary-key order, fetched in batches (for downloads)."""
    cols = [iterations.c[name] for name in ITERATION_COLUMNS]
    stmt = select(*cols).where(iterations.c.run_id == run_id).order_by(
        iterations.c.worker, iterations.c.iteration)
    with reading(engine, f"exporting run {run_id}") as conn:
        result = conn.execution_options(yield_per=batch).execute(stmt)
        for row in result:
            yield tuple(row)


def run_exists(engine: Engine, run_id: str) -> bool:
    with reading(engine, f"reading run {run_id}") as conn:
        return conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None
