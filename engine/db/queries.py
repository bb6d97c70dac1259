"""Read-only queries over the experiments database, for the CLI, live progress and dashboard.

Every function takes an engine (normally ``open_engine(path, readonly=True)``) and returns frozen
dataclasses whose ``to_dict()`` is JSON-serialisable. The stored status ``running`` is reported
as ``crashed`` once the run's heartbeat is older than ``crash_after_s``: a coordinator that died
without a word cannot write that itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    Select,
    and_,
    func,
    not_,
    or_,
    select,
)

from engine.db.clock import TrainingClock, distinct_workers, training_clock
from engine.db.faults import fault_timeline
from engine.db.memory import MemoryPeak, memory_peak
from engine.db.nodes import role_nodes
from engine.db.schema import (
    STORED_STATUSES,
    evaluations,
    events,
    iterations,
    layer_iterations,
    parse_json,
    runs,
    syncs,
    tags,
)
from engine.db.schema import translate_errors as _translate_errors
from engine.db.startup import StartUp, run_start_up
from engine.db.stored import StoredKeys, stored_keys
from engine.errors import AmbiguousRun, RunNotFound, StoreError

CRASH_AFTER_S = 15.0
PROGRESS_WINDOW_S = 5.0
MIN_RATE_WINDOW_S = 1.0  # a rate over less training than this is no rate (and no ETA)
RECENT_EVENTS = 20
_MAX_CANDIDATES = 10

STATUSES = (*STORED_STATUSES, "crashed")
# Run ids are uuid4 hex; a longer selector can only be a name (and SQLite refuses LIKE patterns
# past 50 000 bytes).
_ID_LENGTH = 32
# SQLite's integers are signed 64-bit; the driver raises OverflowError for a larger parameter.
SQLITE_INT_MAX = 2**63 - 1
# @last~N with more digits than this reaches past any database (and past SQLITE_INT_MAX).
_MAX_BACK_DIGITS = 18
_ECHO_LIMIT = 80


def quoted(text: str, limit: int = _ECHO_LIMIT) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters: what a user typed is
    echoed back so they see which value was refused, but never a pasted megabyte."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


class Dictable:
    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and numbers, ready for ``json.dumps``."""
        return dataclasses.asdict(cast(Any, self))


@dataclass(frozen=True)
class RunSummary(Dictable):
    id: str
    name: str
    status: str  # effective: one of STATUSES
    started_at: float
    ended_at: float | None
    # to ended_at; to now while running; to the last heartbeat if crashed; less the time it was
    # down between a crash or failure and its ``psctl resume`` (the ``resumed`` events')
    duration_s: float
    heartbeat_at: float
    sync: str
    workers: int
    servers: int
    dataset: str
    iterations: int
    best_accuracy: float | None
    final_accuracy: float | None


@dataclass(frozen=True)
class WorkerStats(Dictable):
    worker: int
    iterations: int
    samples: int
    first_started_at: float
    last_ended_at: float
    wall_s: float  # last_ended_at - first_started_at, less a resumed run's downtime
    compute_s_total: float
    compute_s_mean: float
    push_s_total: float
    push_s_mean: float
    pull_s_total: float
    pull_s_mean: float
    wait_s_total: float
    wait_s_mean: float
    idle_fraction: float | None  # wait_s_total / wall_s; None when wall_s is 0
    staleness_mean: float
    staleness_max: int
    iteration_s_mean: float  # mean of ended_at - started_at
    samples_per_s: float | None  # samples / wall_s; None when wall_s is 0
    bytes_sent: int
    bytes_received: int
    # The applied learning-rate scale over the iterations that pushed (None: none recorded).
    lr_scale_mean: float | None = None
    lr_scale_min: float | None = None
    lr_scale_max: float | None = None
    # Push frames' bytes as sent and as dense float32 frames (None: recorded before schema 5).
    push_bytes: int | None = None
    push_bytes_dense: int | None = None
    # The bytes reads answered from the worker's cache did not move (None: before schema 6).
    pull_bytes_saved: int | None = None

    @property
    def push_reduction(self) -> float | None:
        """How many times fewer bytes the push filter sent than dense pushes would have."""
        if not self.push_bytes or self.push_bytes_dense is None:
            return None
        return self.push_bytes_dense / self.push_bytes


@dataclass(frozen=True)
class RunTotals(Dictable):
    iterations: int
    samples: int
    # Last iteration end - first iteration start, over all workers, less a resumed run's
    # downtime (engine/db/downtime.py).
    wall_s: float
    samples_per_s: float | None
    compute_s: float
    push_s: float
    pull_s: float
    wait_s: float
    bytes_sent: int
    bytes_received: int
    # From the command's start (else the run's recorded start) to its first iteration: one
    # number, engine/db/clock.py; None without iterations. Training times (time to target, the
    # evaluations, plots) count from the first iteration.
    startup_s: float | None = None
    first_iteration_at: float | None = None


@dataclass(frozen=True)
class EvaluationPoint(Dictable):
    at: float
    elapsed_s: float  # as recorded: since the run's start (the coordinator's clock)
    step: int
    epoch: float
    accuracy: float
    loss: float
    # Seconds of training from the first iteration (engine/db/clock.py), as every view counts;
    # None where no clock was read (the live progress).
    training_s: float | None = None


@dataclass(frozen=True)
class EventEntry(Dictable):
    at: float
    kind: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class SyncSummary(Dictable):
    """ElasticBSP barriers that every worker reached (the monitoring one not counted)."""

    barriers: int
    predicted_wait_mean_s: float | None
    actual_wait_mean_s: float | None
    # How far ahead each barrier was placed: the farthest worker's iterations after its last.
    distance_mean: float | None = None
    distance_max: int | None = None


@dataclass(frozen=True)
class RunDetail(Dictable):
    summary: RunSummary
    reason: str | None
    config: dict[str, Any]
    workers: tuple[WorkerStats, ...]
    totals: RunTotals
    evaluations: tuple[EvaluationPoint, ...]
    event_counts: dict[str, int]
    recent_events: tuple[EventEntry, ...]  # the last RECENT_EVENTS, oldest first
    syncs: SyncSummary | None = None  # ElasticBSP runs only
    # What the coordinator said when the run had more busy processes than usable cores: its
    # timings are then shaped by CPU contention, and every view says so.
    oversubscribed: str | None = None
    notes: str | None = None  # written from the dashboard's runs table
    layers: tuple[LayerStats, ...] = ()  # the scheduled worker loop's, per layer
    # A run of the simulated cluster (its times are virtual): what its models were.
    simulated: str | None = None
    # Its faults and recovery: (seconds of training, event kind, what happened).
    faults: tuple[tuple[float, str, str], ...] = ()
    # A resumed run's downtime: {start, end, seconds} per resume (unix times), and the seconds
    # of training it came at (training_s).
    downtime: tuple[dict[str, float], ...] = ()
    # Where its roles ran: (node address, roles on it), from the events they joined with.
    nodes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Its memory at the peak, proportional (PSS); None for runs before schema 8.
    memory: MemoryPeak | None = None
    # Where its start-up went (engine.db.startup); None for runs no launcher told it of.
    start_up: StartUp | None = None
    # The keys its servers stored at their end (engine.db.stored); None before issue 44.
    stored: StoredKeys | None = None


@dataclass(frozen=True)
class LayerStats(Dictable):
    """One layer's requests over a run of the scheduled loop (``layer_iterations``)."""

    layer: int
    pulls: int
    suspend_s_mean: float  # how long the servers held the layer's pull back
    suspend_s_max: float
    staleness_mean: float
    staleness_max: int
    pull_order_mean: float  # where the schedule put the layer: 0 is first


@dataclass(frozen=True)
class WorkerProgress(Dictable):
    worker: int
    iteration: int  # the highest recorded
    epoch: int
    staleness: int
    loss: float | None
    ended_at: float
    iterations_per_s: float  # over the last window_s before the reference time


@dataclass(frozen=True)
class Progress(Dictable):
    run_id: str
    name: str
    status: str
    now: float
    started_at: float
    ended_at: float | None
    heartbeat_at: float
    total_iterations: int
    iterations_per_s: float
    workers: tuple[WorkerProgress, ...]
    latest_evaluation: EvaluationPoint | None
    best_accuracy: float | None
    startup: Startup | None = None
    # When its (latest) training started: the end of start-up; None until then.
    training_started_at: float | None = None
    startup_s: float | None = None  # start-up, one number (engine/db/clock.py)


@dataclass(frozen=True)
class Startup(Dictable):
    """How far start-up has come, from the coordinator's events; ``planned_iterations`` (every
    worker's epochs x iterations per epoch) is known once training has started."""

    processes_joined: int
    servers_listening: int
    workers_ready: int
    planned_iterations: int | None


_STARTUP_KINDS = ("process_joined", "server_listening", "worker_ready")


def startup(conn: Connection, run_id: str) -> Startup:
    ec = events.c
    counts: dict[str, int] = dict(conn.execute(
        select(ec.kind, func.count()).where(ec.run_id == run_id, ec.kind.in_(_STARTUP_KINDS))
        .group_by(ec.kind)).all())
    detail = conn.execute(select(ec.detail).where(ec.run_id == run_id,
                                                  ec.kind == "training_started").limit(1)).scalar()
    planned = None if detail is None else parse_json(detail).get("total_iterations")
    return Startup(processes_joined=int(counts.get("process_joined", 0)),
                   servers_listening=int(counts.get("server_listening", 0)),
                   workers_ready=int(counts.get("worker_ready", 0)),
                   planned_iterations=planned if isinstance(planned, int) else None)


# -- status --------------------------------------------------------------------------------------


def effective_status(stored: str, heartbeat_at: float, now: float, crash_after_s: float) -> str:
    if stored == "running" and now - heartbeat_at > crash_after_s:
        return "crashed"
    return stored


def _status_filter(status: str, now: float, crash_after_s: float) -> ColumnElement[bool]:
    stale = runs.c.heartbeat_at < now - crash_after_s
    if status == "crashed":
        return and_(runs.c.status == "running", stale)
    if status == "running":
        return and_(runs.c.status == "running", not_(stale))
    if status in STORED_STATUSES:
        return runs.c.status == status
    raise StoreError(f"unknown run status {quoted(status)}; expected one of "
                     f"{', '.join(STATUSES)}")


# -- summaries -----------------------------------------------------------------------------------


def _summary_select() -> Select[Any]:
    ev = evaluations.c
    best = select(func.max(ev.accuracy)).where(ev.run_id == runs.c.id).scalar_subquery()
    final = (
        select(ev.accuracy)
        .where(ev.run_id == runs.c.id)
        .order_by(ev.at.desc(), ev.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    return select(runs, best.label("best_accuracy"), final.label("final_accuracy"),
                  _downtime(runs.c.id).label("downtime_s"))


def _downtime(run_id: Any) -> Any:
    """Seconds a run was down before its resumes, from its ``resumed`` events."""
    down = func.json_extract(events.c.detail, "$.downtime_s")
    return (select(func.coalesce(func.sum(down), 0.0))
            .where(events.c.run_id == run_id, events.c.kind == "resumed").scalar_subquery())


def resume_clock(conn: Connection, run_id: str, now: float) -> tuple[float, float, float]:
    """For a run about to be resumed: (seconds it was active so far, seconds it has been down
    since its last sign of life, the highest epoch it was evaluated at)."""
    row = conn.execute(select(runs.c.started_at, runs.c.ended_at, runs.c.heartbeat_at,
                              _downtime(run_id)).where(runs.c.id == run_id)).one_or_none()
    if row is None:
        raise RunNotFound(f"no run {quoted(run_id)} to resume")
    started, ended, heartbeat, down = row
    last = ended if ended is not None else heartbeat
    epoch = conn.execute(select(func.max(evaluations.c.epoch))
                         .where(evaluations.c.run_id == run_id)).scalar()
    return (max(0.0, last - started - float(down or 0.0)), max(0.0, now - last),
            float(epoch or 0.0))


def run_summary(row: Row[Any], now: float, crash_after_s: float) -> RunSummary:
    m = row._mapping
    status = effective_status(m["status"], m["heartbeat_at"], now, crash_after_s)
    return RunSummary(
        id=m["id"],
        name=m["name"],
        status=status,
        started_at=m["started_at"],
        ended_at=m["ended_at"],
        duration_s=max(0.0, _duration(status, m["started_at"], m["ended_at"], m["heartbeat_at"],
                                      now) - float(m["downtime_s"] or 0.0)),
        heartbeat_at=m["heartbeat_at"],
        sync=m["sync"],
        workers=m["workers"],
        servers=m["servers"],
        dataset=m["dataset"],
        iterations=m["iteration_count"],
        best_accuracy=m["best_accuracy"],
        final_accuracy=m["final_accuracy"],
    )


def _duration(
    status: str, started_at: float, ended_at: float | None, heartbeat_at: float, now: float
) -> float:
    if ended_at is not None:
        end = ended_at
    elif status == "crashed":
        end = heartbeat_at
    else:
        end = now
    return max(0.0, end - started_at)


@contextmanager
def reading(engine: Engine, action: str) -> Iterator[Connection]:
    # One connection, one read transaction: every query of a call sees the same snapshot.
    with _translate_errors(action), engine.connect() as conn:
        yield conn


def list_runs(
    engine: Engine,
    *,
    status: str | None = None,
    limit: int | None = None,
    now: float | None = None,
    crash_after_s: float = CRASH_AFTER_S,
) -> list[RunSummary]:
    """Recorded runs, newest first, optionally only those whose effective status is ``status``."""
    now = time.time() if now is None else now
    stmt = _summary_select().order_by(runs.c.started_at.desc(), runs.c.id.desc())
    if status is not None:
        stmt = stmt.where(_status_filter(status, now, crash_after_s))
    if limit is not None:
        stmt = stmt.limit(max(0, limit))
    with reading(engine, "listing runs") as conn:
        return [run_summary(row, now, crash_after_s) for row in conn.execute(stmt)]


def run_summaries(
    engine: Engine,
    run_ids: Sequence[str],
    *,
    now: float | None = None,
    crash_after_s: float = CRASH_AFTER_S,
) -> list[RunSummary]:
    """Summaries of the given runs, in the order given; unknown ids raise RunNotFound."""
    now = time.time() if now is None else now
    stmt = _summary_select().where(runs.c.id.in_(list(run_ids)))
    with reading(engine, "reading runs") as conn:
        found = {row.id: run_summary(row, now, crash_after_s) for row in conn.execute(stmt)}
    missing = [run_id for run_id in run_ids if run_id not in found]
    if missing:
        raise RunNotFound(f"no run with id {quoted(missing[0])}")
    return [found[run_id] for run_id in run_ids]


# -- resolving selectors -------------------------------------------------------------------------

_LAST = re.compile(r"@last(?:~(\d+))?")


def resolve_run(engine: Engine, selector: str) -> str:
    """The run id named by a full id, a unique id prefix, an exact name, ``@last`` or ``@last~N``.

    A prefix and a name are matched together, so a selector that is one run's name and another's
    id prefix is reported as ambiguous rather than silently picking one.
    """
    sel = selector.strip()
    if not sel:
        raise RunNotFound("an empty run selector matches no run; give an id, a name or @last")
    with reading(engine, f"resolving run {quoted(sel)}") as conn:
        if sel.startswith("@"):
            return _resolve_last(conn, sel)
        if conn.execute(select(runs.c.id).where(runs.c.id == sel)).first() is not None:
            return sel
        return _resolve_prefix_or_name(conn, sel)


def _resolve_last(conn: Connection, sel: str) -> str:
    match = _LAST.fullmatch(sel)
    if match is None:
        raise RunNotFound(f"unknown run selector {quoted(sel)}; use @last or @last~N")
    back = (match.group(1) or "0").lstrip("0") or "0"
    run_id = None
    if len(back) <= _MAX_BACK_DIGITS:
        stmt = select(runs.c.id).order_by(runs.c.started_at.desc(), runs.c.id.desc())
        run_id = conn.execute(stmt.offset(int(back)).limit(1)).scalar()
    if run_id is None:
        count = conn.execute(select(func.count()).select_from(runs)).scalar_one()
        raise RunNotFound(f"no run matches {quoted(sel)}: {count} run(s) recorded")
    return str(run_id)


def _resolve_prefix_or_name(conn: Connection, sel: str) -> str:
    named = runs.c.name == sel
    prefixed = runs.c.id.startswith(sel.lower(), autoescape=True)
    stmt = (
        select(runs.c.id, runs.c.name, runs.c.started_at)
        .where(named if len(sel) > _ID_LENGTH else or_(named, prefixed))
        .order_by(runs.c.started_at.desc())
        .limit(_MAX_CANDIDATES + 1)
    )
    found = conn.execute(stmt).all()
    if not found:
        raise RunNotFound(
            f"no run matches {quoted(sel)} (not a run id, id prefix or name); "
            "`psctl runs ls` lists the recorded runs"
        )
    if len(found) == 1:
        return str(found[0].id)
    raise AmbiguousRun(_ambiguity_message(sel, found))


def _ambiguity_message(sel: str, found: Sequence[Any]) -> str:
    shown = found[:_MAX_CANDIDATES]
    lines = [f"  {r.id}  {r.name}  started {_iso(r.started_at)}" for r in shown]
    more = "  ... and more\n" if len(found) > _MAX_CANDIDATES else ""
    return (
        f"{quoted(sel)} matches more than one run:\n"
        + "\n".join(lines)
        + "\n"
        + more
        + "give more characters of the id to pick one"
    )


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


# -- detail --------------------------------------------------------------------------------------


def run_detail(
    engine: Engine,
    run_id: str,
    *,
    now: float | None = None,
    crash_after_s: float = CRASH_AFTER_S,
) -> RunDetail:
    """Everything about one run; per-worker statistics are aggregated by SQLite in one pass."""
    now = time.time() if now is None else now
    with reading(engine, f"reading run {run_id}") as conn:
        row = fetch_run(conn, run_id)
        clock = training_clock(conn, run_id, row.started_at)
        workers = tuple(_worker_stats(r, clock)
                        for r in conn.execute(_worker_stats_select(run_id)))
        counts = conn.execute(_event_counts_select(run_id)).all()
        return RunDetail(
            summary=run_summary(row, now, crash_after_s),
            reason=row.reason,
            config=parse_json(row.config_json),
            workers=workers,
            totals=_totals(workers, clock),
            evaluations=tuple(_evaluation_points(conn, run_id, clock)),
            event_counts={str(kind): int(n) for kind, n in counts},
            recent_events=tuple(_recent_events(conn, run_id)),
            syncs=_sync_summary(conn, run_id),
            oversubscribed=oversubscription_note(conn, run_id),
            notes=row.notes,
            layers=tuple(_layer_stats(conn, run_id)),
            simulated=simulation_note(conn, run_id),
            faults=tuple(fault_timeline(conn, run_id, clock.seconds)),
            nodes=role_nodes(conn, run_id),
            downtime=tuple({**span, "training_s": clock.seconds(span["start"])}
                           for span in clock.downtime.to_list()),
            memory=memory_peak(conn, run_id, clock.seconds),
            start_up=run_start_up(conn, run_id, clock),
            stored=stored_keys(conn, run_id),
        )


def _layer_stats(conn: Connection, run_id: str) -> list[LayerStats]:
    li = layer_iterations.c
    stmt = (select(li.layer, func.count(), func.avg(li.suspend_s), func.max(li.suspend_s),
                   func.avg(li.staleness), func.max(li.staleness), func.avg(li.pull_order))
            .where(li.run_id == run_id).group_by(li.layer).order_by(li.layer))
    return [LayerStats(int(layer), int(n), float(s_mean), float(s_max), float(t_mean),
                       int(t_max), float(order))
            for layer, n, s_mean, s_max, t_mean, t_max, order in conn.execute(stmt)]


def _first_event_detail(conn: Connection, run_id: str, kind: str) -> dict[str, Any] | None:
    detail = conn.execute(
        select(events.c.detail).where(events.c.run_id == run_id,
                                      events.c.kind == kind).limit(1)).scalar()
    return None if detail is None else parse_json(detail)


def tagged_runs(engine: Engine, key: str, value: str) -> dict[str, tuple[str, str]]:
    """Run name -> (run id, status) of the runs tagged ``key=value``; of runs that share a name
    (a point run again by ``psctl study --resume``) the latest started."""
    with reading(engine, f"reading the runs tagged {key}={value}") as conn:
        rows = conn.execute(select(runs.c.name, runs.c.id, runs.c.status)
                            .join(tags, tags.c.run_id == runs.c.id)
                            .where(tags.c.key == key, tags.c.value == value)
                            .order_by(runs.c.started_at))
        return {str(name): (str(run_id), str(status)) for name, run_id, status in rows}


def epoch_time_s(conn: Connection, run_id: str) -> float | None:
    """Seconds of training (from the first iteration) until its workers together had finished
    one epoch's worth of iterations (every worker's share of the data once, in any mix): the
    speed of a pass over the data, which a straggler's tail does not decide under asynchronous
    models. None before training started or when the run never got that far."""
    planned = startup(conn, run_id).planned_iterations
    config = parse_json(fetch_run(conn, run_id).config_json)
    epochs = int(config.get("train", {}).get("epochs", 0) or 0)
    if not planned or epochs < 1:
        return None
    it = iterations.c
    ended = conn.execute(
        select(it.ended_at).where(it.run_id == run_id).order_by(it.ended_at)
        .offset(planned // epochs - 1).limit(1)).scalar()
    return None if ended is None else training_clock(conn, run_id).seconds(float(ended))


def oversubscription_note(conn: Connection, run_id: str) -> str | None:
    """The message of the run's ``oversubscribed`` event, or None if it has none."""
    values = _first_event_detail(conn, run_id, "oversubscribed")
    if values is None:
        return None
    message = values.get("message")
    return str(message) if message else "more busy processes than cores"


def simulation_note(conn: Connection, run_id: str) -> str | None:
    """How a simulated run turned work into virtual time (its ``simulated`` event), or None."""
    values = _first_event_detail(conn, run_id, "simulated")
    if values is None:
        return None
    if isinstance(values.get("note"), str):  # recorded in words by the simulator
        return str(values["note"])

    def how(key: str) -> str:
        return "measured" if values.get(key) else "given"

    return (f"compute {float(values.get('compute_ms', 0)):.3g} ms per batch "
            f"({how('compute_measured')}), network {values.get('network', '?')}, "
            f"{float(values.get('update_ms', 0)):.3g} ms per {update_of(values)} "
            f"({how('update_measured')})")


def update_of(values: dict[str, Any]) -> str:
    """What a simulated run's reference server update is: a model of sparse samples' is the
    push of one batch's working set (its event says so), any other's the whole model."""
    of = values.get("update_of")
    if of is None:
        return "dense update of the whole model"
    return f"{of} ({int(values.get('update_keys', 0)):,} keys)"


def _sync_summary(conn: Connection, run_id: str) -> SyncSummary | None:
    rows = conn.execute(
        select(syncs.c.predicted_wait, syncs.c.actual_wait, syncs.c.chosen)
        .where(syncs.c.run_id == run_id, syncs.c.predictor != "monitoring",
               syncs.c.released_at.is_not(None))).all()
    if not rows:
        return None
    distances = [barrier_distance(json.loads(row.chosen)) for row in rows]
    actual = [row.actual_wait for row in rows if row.actual_wait is not None]
    return SyncSummary(len(rows), sum(row.predicted_wait for row in rows) / len(rows),
                       sum(actual) / len(actual) if actual else None,
                       sum(distances) / len(distances), max(distances))


def barrier_distance(chosen: list[int]) -> int:
    """How far ahead a barrier was placed: the most iterations any taking part worker runs
    to it (r_i + 1; r_i is -1 for a worker that had finished)."""
    return max((r + 1 for r in chosen if r >= 0), default=0)


def fetch_run(conn: Connection, run_id: str) -> Row[Any]:
    row = conn.execute(_summary_select().where(runs.c.id == run_id)).first()
    if row is None:
        raise RunNotFound(f"no run with id {quoted(run_id)}")
    return row


def _worker_stats_select(run_id: str) -> Select[Any]:
    it = iterations.c
    return (
        select(
            it.worker,
            func.count().label("iterations"),
            func.sum(it.samples).label("samples"),
            func.min(it.started_at).label("first_started_at"),
            func.max(it.ended_at).label("last_ended_at"),
            func.sum(it.compute_s).label("compute_s_total"),
            func.avg(it.compute_s).label("compute_s_mean"),
            func.sum(it.push_s).label("push_s_total"),
            func.avg(it.push_s).label("push_s_mean"),
            func.sum(it.pull_s).label("pull_s_total"),
            func.avg(it.pull_s).label("pull_s_mean"),
            func.sum(it.wait_s).label("wait_s_total"),
            func.avg(it.wait_s).label("wait_s_mean"),
            func.avg(it.staleness).label("staleness_mean"),
            func.max(it.staleness).label("staleness_max"),
            func.avg(it.ended_at - it.started_at).label("iteration_s_mean"),
            func.sum(it.bytes_sent).label("bytes_sent"),
            func.sum(it.bytes_received).label("bytes_received"),
            func.avg(it.lr_scale).label("lr_scale_mean"),
            func.min(it.lr_scale).label("lr_scale_min"),
            func.max(it.lr_scale).label("lr_scale_max"),
            func.sum(it.push_bytes).label("push_bytes"),
            func.sum(it.push_bytes_dense).label("push_bytes_dense"),
            func.sum(it.pull_bytes_saved).label("pull_bytes_saved"),
        )
        .where(it.run_id == run_id)
        .group_by(it.worker)
        .order_by(it.worker)
    )


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _worker_stats(row: Row[Any], clock: TrainingClock) -> WorkerStats:
    m = dict(row._mapping)
    wall = clock.downtime.training_s(m["first_started_at"], m["last_ended_at"])
    return WorkerStats(
        **m,
        wall_s=wall,
        idle_fraction=_ratio(m["wait_s_total"], wall),
        samples_per_s=_ratio(m["samples"], wall),
    )


def _totals(workers: Sequence[WorkerStats], clock: TrainingClock) -> RunTotals:
    wall = 0.0
    if workers:
        wall = clock.seconds(max(w.last_ended_at for w in workers))
    samples = sum(w.samples for w in workers)
    return RunTotals(
        iterations=sum(w.iterations for w in workers),
        samples=samples,
        wall_s=max(0.0, wall),
        samples_per_s=_ratio(samples, wall),
        compute_s=sum(w.compute_s_total for w in workers),
        push_s=sum(w.push_s_total for w in workers),
        pull_s=sum(w.pull_s_total for w in workers),
        wait_s=sum(w.wait_s_total for w in workers),
        bytes_sent=sum(w.bytes_sent for w in workers),
        bytes_received=sum(w.bytes_received for w in workers),
        startup_s=clock.startup_s,
        first_iteration_at=clock.first_iteration_at,
    )


def _evaluation_points(conn: Connection, run_id: str,
                       clock: TrainingClock) -> Iterator[EvaluationPoint]:
    ev = evaluations.c
    stmt = (
        select(ev.at, ev.elapsed_s, ev.step, ev.epoch, ev.accuracy, ev.loss)
        .where(ev.run_id == run_id)
        .order_by(ev.at, ev.id)
    )
    for row in conn.execute(stmt):
        yield EvaluationPoint(**row._mapping, training_s=clock.seconds(row.at))


def _event_counts_select(run_id: str) -> Select[Any]:
    ec = events.c
    return (
        select(ec.kind, func.count()).where(ec.run_id == run_id).group_by(ec.kind).order_by(ec.kind)
    )


def _recent_events(conn: Connection, run_id: str) -> list[EventEntry]:
    ec = events.c
    stmt = (
        select(ec.at, ec.kind, ec.detail)
        .where(ec.run_id == run_id)
        .order_by(ec.at.desc(), ec.id.desc())
        .limit(RECENT_EVENTS)
    )
    rows = conn.execute(stmt).all()
    return [EventEntry(at=r.at, kind=r.kind, detail=parse_json(r.detail)) for r in reversed(rows)]


# -- live progress -------------------------------------------------------------------------------


def progress(
    engine: Engine,
    run_id: str,
    *,
    now: float | None = None,
    window_s: float = PROGRESS_WINDOW_S,
    crash_after_s: float = CRASH_AFTER_S,
) -> Progress:
    """A cheap snapshot for a display polled a few times a second.

    Every query is an index lookup or a range bounded by the last ``window_s`` seconds, so the
    cost does not grow with the length of the run. Rates are measured up to now while the run is
    live, and up to its end (or last heartbeat) once it is not.
    """
    now = time.time() if now is None else now
    with reading(engine, f"reading progress of run {run_id}") as conn:
        summary = run_summary(fetch_run(conn, run_id), now, crash_after_s)
        ref = _reference_time(summary, now)
        training = _training_started(conn, run_id)
        # Over the window, or the part of it the run has trained: a rate over a window still
        # mostly start-up would be far too low (an ETA of minutes for a run seconds from its
        # end). Under MIN_RATE_WINDOW_S of training there is no rate yet.
        window = window_s if training is None else min(window_s, ref - training)
        rates = (_recent_counts(conn, run_id, ref, window)
                 if window >= MIN_RATE_WINDOW_S else {})
        workers = tuple(
            _worker_progress(conn, run_id, w, rates.get(w, 0) / max(window, MIN_RATE_WINDOW_S))
            for w in distinct_workers(conn, run_id)
        )
        return Progress(
            run_id=summary.id,
            name=summary.name,
            status=summary.status,
            now=now,
            started_at=summary.started_at,
            ended_at=summary.ended_at,
            heartbeat_at=summary.heartbeat_at,
            total_iterations=summary.iterations,
            iterations_per_s=sum(w.iterations_per_s for w in workers),
            workers=workers,
            latest_evaluation=_latest_evaluation(conn, run_id),
            best_accuracy=summary.best_accuracy,
            startup=startup(conn, run_id),
            training_started_at=training,
            startup_s=training_clock(conn, run_id, summary.started_at).startup_s,
        )


def _training_started(conn: Connection, run_id: str) -> float | None:
    """When training last started (a resumed run starts again), from its event."""
    ec = events.c
    at = conn.execute(select(func.max(ec.at)).where(
        ec.run_id == run_id, ec.kind.in_(("training_started", "training_resumed")))).scalar()
    return None if at is None else float(at)


def _reference_time(summary: RunSummary, now: float) -> float:
    if summary.status == "running":
        return now
    return summary.ended_at if summary.ended_at is not None else summary.heartbeat_at


def _recent_counts(conn: Connection, run_id: str, ref: float, window_s: float) -> dict[int, int]:
    it = iterations.c
    stmt = (
        select(it.worker, func.count())
        .where(it.run_id == run_id, it.ended_at > ref - window_s, it.ended_at <= ref)
        .group_by(it.worker)
    )
    return {int(w): int(n) for w, n in conn.execute(stmt)}


def _worker_progress(conn: Connection, run_id: str, worker: int, rate: float) -> WorkerProgress:
    it = iterations.c
    stmt = (
        select(it.iteration, it.epoch, it.staleness, it.loss, it.ended_at)
        .where(it.run_id == run_id, it.worker == worker)
        .order_by(it.iteration.desc())
        .limit(1)
    )
    row = conn.execute(stmt).one()
    return WorkerProgress(worker=worker, **row._mapping, iterations_per_s=rate)


def _latest_evaluation(conn: Connection, run_id: str) -> EvaluationPoint | None:
    ev = evaluations.c
    stmt = (
        select(ev.at, ev.elapsed_s, ev.step, ev.epoch, ev.accuracy, ev.loss)
        .where(ev.run_id == run_id)
        .order_by(ev.at.desc(), ev.id.desc())
        .limit(1)
    )
    row = conn.execute(stmt).first()
    return None if row is None else EvaluationPoint(**row._mapping)
