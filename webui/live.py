"""Pushing a run to the browser: one snapshot when a page connects, then only what changed.

The websocket handler polls the database every ``POLL_S`` with a few index lookups
(:func:`engine.db.series.run_marker`); only when something changed does it read the new rows,
through per-worker iteration cursors, and send the buckets they fell into, new evaluations,
events, barriers, the per-process CPU/memory samples and, as each server ends, the keys the
servers stored. The first message of every connection is a full snapshot, so a page that
reconnects is never left with a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from sqlalchemy import ColumnClause, Engine, Integer, func, literal_column, select
from starlette.concurrency import run_in_threadpool

from engine.db import list_runs, series
from engine.db.queries import reading
from engine.db.schema import process_samples
from engine.errors import PsctlError
from webui.metrics import RECORD_FIELDS, derive

# The page redraws a live run at most once a second (webui/static/run.js): polling faster
# would only cost this process, and the page, CPU for deltas the page merges anyway.
POLL_S = 0.75
ENDED_POLL_S = 1.0
TIMELINE_EVERY_S = 2.0  # the timeline's raw rows are the largest part of a delta
TIMELINE_WINDOW_S = 20.0  # raw iterations of the last 20 s, at most TIMELINE_LIMIT of them
TIMELINE_LIMIT = 3000
RESNAPSHOT_FACTOR = 2  # once a live run outgrows its buckets this many times, coarsen them
RUNS_POLL_S = 1.0  # the runs list: one small indexed query a second
PAINT_WAIT_S = 2.0  # the longest the staleness histogram waits for the page's first charts
# One sample per process a second: a day-long run of 8 processes would be 700,000 points, so
# the snapshot averages them into at most this many time slots per process.
PROCESS_POINTS = 600
PROCESS_LATE_S = 5.0  # a sample committed this late (behind a newer one) is still picked up


@dataclass
class LiveState:
    run_id: str
    workers: int
    width: float
    origin: float
    marker: dict[str, Any]
    cursors: dict[int, int]
    unreleased_sync: int = 0
    timeline_at: float = 0.0
    samples: tuple[float, int] = (0.0, 0)  # (at, rowid) of the newest process sample sent
    extra: dict[str, Any] = field(default_factory=dict)
    # The page's tab is hidden: nothing is read or sent until it is shown again, when the next
    # delta brings everything since (the cursors stayed where they were).
    paused: bool = False
    # The page shows the synchronisation timeline (it says when the chart scrolls in or out of
    # view): its raw rows, most of a delta's bytes, are sent only then.
    timeline_wanted: bool = True
    clocked: bool = False  # the page has been sent the first iteration's time


def snapshot(engine: Engine, run_id: str) -> tuple[dict[str, Any], LiveState]:
    """Everything the run page draws, and the cursors deltas continue from."""
    now = time.time()
    marker = series.run_marker(engine, run_id, now)
    header = series.run_header(engine, run_id, now)
    workers = int(header["summary"]["workers"])
    # Cursors before buckets: a row landing in between is counted in a later delta, never lost.
    cursors = series.worker_cursors(engine, run_id, workers)
    buckets = series.iteration_buckets(engine, run_id)
    syncs = series.syncs_from(engine, run_id)
    state = LiveState(run_id, workers, buckets.width, buckets.origin, marker, cursors,
                      unreleased_sync=_first_unreleased(syncs, 0),
                      clocked=(header["clock"]["first_iteration_at"] is not None
                               and not header["clock"]["downtime"]))
    state.samples = _newest_sample(engine, run_id)
    message = {
        "type": "snapshot", **header, "record_fields": list(RECORD_FIELDS),
        "origin": buckets.origin, "width": buckets.width, "total_rows": buckets.total_rows,
        "records": derive(buckets), "last": series.last_points(engine, run_id, workers),
        "evaluations": series.evaluations_since(engine, run_id),
        "events": series.events_since(engine, run_id), "syncs": syncs,
        # Below the fold, and each costly for a long run: the timeline (3000 raw rows, half
        # the message) and the process samples follow the first paint in messages of their own.
        "timeline": [], "timeline_window_s": TIMELINE_WINDOW_S, "timeline_limit": TIMELINE_LIMIT,
    }
    return message, state


def staleness_message(engine: Engine, state: LiveState) -> dict[str, Any]:
    """The staleness histogram up to the snapshot's cursors (sent after the first paint)."""
    counts = series.staleness_histogram(engine, state.run_id, upto=state.cursors)
    return {"type": "staleness", "counts": counts, "replace": True}


def timeline_message(engine: Engine, state: LiveState) -> dict[str, Any]:
    """The synchronisation timeline's raw rows (sent after the first paint)."""
    state.timeline_at = time.time()
    return {"type": "timeline", "timeline": _timeline(engine, state.run_id)}


def processes_message(engine: Engine, state: LiveState) -> dict[str, Any]:
    """Every process's CPU and memory samples up to the snapshot (sent after the first paint;
    deltas carry the newer ones)."""
    samples, width = process_snapshot(engine, state.run_id, upto=state.samples)
    return {"type": "processes",
            "fields": ["role", "rank", "at", "cpu_percent", "rss_bytes", "pss_bytes"],
            "samples": samples, "width_s": width}


def process_snapshot(engine: Engine, run_id: str, upto: tuple[float, int] | None = None
                     ) -> tuple[list[list[Any]], float]:
    """Every process's CPU and memory samples as [role, rank, at, cpu %, rss bytes, pss bytes
    or None], averaged into equal time slots (RSS and PSS: the slot's maximum; PSS None in a
    slot without a reading) when there are more than PROCESS_POINTS per process; also the slot
    width in seconds (0 when the samples are sent as recorded)."""
    pc = process_samples.c
    where = [pc.run_id == run_id]
    if upto is not None:
        where.append(pc.at <= upto[0])
    with reading(engine, f"reading process samples of run {run_id}") as conn:
        lo, hi, count = conn.execute(
            select(func.min(pc.at), func.max(pc.at), func.count()).where(*where)).one()
        if not count:
            return [], 0.0
        processes = conn.execute(
            select(func.count()).select_from(select(pc.role, pc.rank).where(*where)
                                             .distinct().subquery())).scalar() or 1
        if count <= PROCESS_POINTS * processes:
            stmt = (select(pc.role, pc.rank, pc.at, pc.cpu_percent, pc.rss_bytes, pc.pss_bytes)
                    .where(*where).order_by(pc.at, pc.role, pc.rank))
            return [list(r) for r in conn.execute(stmt)], 0.0
        width = float(math.ceil((hi - lo) / PROCESS_POINTS)) or 1.0
        slot = func.cast((pc.at - lo) / width, process_samples.c.rank.type)
        stmt = (select(pc.role, pc.rank, func.avg(pc.at), func.avg(pc.cpu_percent),
                       func.max(pc.rss_bytes), func.max(pc.pss_bytes))
                .where(*where).group_by(pc.role, pc.rank, slot).order_by(func.avg(pc.at)))
        return [[r[0], r[1], r[2], r[3], int(r[4]), None if r[5] is None else int(r[5])]
                for r in conn.execute(stmt)], width


def _rowid() -> ColumnClause[int]:
    return literal_column("process_samples.rowid", Integer)


def _newest_sample(engine: Engine, run_id: str) -> tuple[float, int]:
    """(at, rowid) of the run's newest process sample: one index lookup, cheap every poll."""
    pc = process_samples.c
    with reading(engine, f"polling process samples of run {run_id}") as conn:
        row = conn.execute(select(pc.at, _rowid()).where(pc.run_id == run_id)
                           .order_by(pc.at.desc(), _rowid().desc()).limit(1)).first()
    return (0.0, 0) if row is None else (float(row[0]), int(row[1]))


def _new_samples(engine: Engine, state: LiveState) -> list[list[Any]]:
    """Samples recorded since the last call, raw (a poll's worth is a handful per process).

    The rowid says what was sent; the time bound keeps the lookup on the (run_id, at) index.
    """
    pc = process_samples.c
    at, rowid = state.samples
    stmt = (select(pc.role, pc.rank, pc.at, pc.cpu_percent, pc.rss_bytes, pc.pss_bytes,
                   _rowid())
            .where(pc.run_id == state.run_id, pc.at >= at - PROCESS_LATE_S, _rowid() > rowid)
            .order_by(pc.at, _rowid()))
    with reading(engine, f"reading process samples of run {state.run_id}") as conn:
        rows = [list(r) for r in conn.execute(stmt)]
    if rows:
        state.samples = (max(at, max(float(r[2]) for r in rows)), max(int(r[6]) for r in rows))
    return [r[:6] for r in rows]



def delta(engine: Engine, state: LiveState) -> dict[str, Any] | None:
    """What changed since the last call, or None; advances ``state``."""
    now = time.time()
    marker = series.run_marker(engine, state.run_id, now)
    old, state.marker = state.marker, marker
    newest = _newest_sample(engine, state.run_id)
    sampled = newest[1] != state.samples[1]
    if _without_duration(marker) == _without_duration(old) and not sampled:
        return None  # the duration of a live run grows by itself; the heartbeat says it lives
    out: dict[str, Any] = {"type": "delta", "summary": marker["summary"]}
    if sampled:
        out["process_samples"] = _new_samples(engine, state)
    if marker["iterations"] != old["iterations"]:
        _add_iterations(engine, state, out, now)
    if marker["eval_id"] != old["eval_id"]:
        out["evaluations"] = series.evaluations_since(engine, state.run_id, old["eval_id"])
    if marker["event_id"] != old["event_id"]:
        out["events"] = series.events_since(engine, state.run_id, old["event_id"])
        if any(e["kind"] == "server_stats" for e in out["events"]):
            # A server said at its end how many keys it stored: the sums, anew.
            out["stored"] = series.run_stored(engine, state.run_id)
    if marker["event_id"] != old["event_id"] or (marker["iterations"] and not state.clocked):
        # The axis's origin (the first iteration) and a resume's gap: known once they happen.
        out["clock"] = series.run_clock(engine, state.run_id)
        # A resumed run's span ends with its first new iteration: asked again as rows come.
        state.clocked = (out["clock"]["first_iteration_at"] is not None
                         and not out["clock"]["downtime"])
    if marker["syncs"] != old["syncs"]:
        out["syncs"] = series.syncs_from(engine, state.run_id, state.unreleased_sync)
        state.unreleased_sync = _first_unreleased(out["syncs"], state.unreleased_sync)
    return out


def _without_duration(marker: dict[str, Any]) -> dict[str, Any]:
    summary = {k: v for k, v in marker["summary"].items() if k != "duration_s"}
    return {**marker, "summary": summary}


def _add_iterations(engine: Engine, state: LiveState, out: dict[str, Any], now: float) -> None:
    fresh = series.new_rows(engine, state.run_id, state.workers, state.cursors)
    state.cursors = fresh.cursors
    if fresh.first_ended_at is None:
        return
    first_bucket = max(0, math.floor((fresh.first_ended_at - state.origin) / state.width))
    tail = series.iteration_buckets(engine, state.run_id, width=state.width,
                                    from_bucket=first_bucket)
    out.update(records=derive(tail), from_bucket=first_bucket, total_rows=tail.total_rows,
               staleness=fresh.staleness, last=series.last_points(engine, state.run_id,
                                                                 state.workers))
    last_bucket = max((r[1] for r in tail.rows), default=0)
    out["resnapshot"] = last_bucket > RESNAPSHOT_FACTOR * series.DEFAULT_BUCKETS
    if state.timeline_wanted and now - state.timeline_at >= TIMELINE_EVERY_S:
        state.timeline_at = now
        out["timeline"] = _timeline(engine, state.run_id)


def _timeline(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    return series.recent_iterations(engine, run_id, seconds=TIMELINE_WINDOW_S,
                                    limit=TIMELINE_LIMIT)


def _first_unreleased(syncs: list[dict[str, Any]], default: int) -> int:
    pending = [s["sync_index"] for s in syncs if s.get("released_at") is None]
    if pending:
        return int(min(pending))
    return max((s["sync_index"] + 1 for s in syncs), default=default)


async def serve(socket: WebSocket, engine: Engine, run_id: str) -> None:
    """Send a snapshot, then deltas until the page goes away."""
    await socket.accept()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        try:
            message, state = await run_in_threadpool(snapshot, engine, run_id)
        except PsctlError as exc:
            await socket.send_json({"type": "error", "message": str(exc)})
            await socket.close()
            return
        await socket.send_json(message)
        await _below_the_fold(socket, engine, state)
        await _push_loop(socket, engine, state)


async def _below_the_fold(socket: WebSocket, engine: Engine, state: LiveState) -> None:
    """What follows a snapshot once the page has drawn it."""
    await _after_paint(socket, state)
    for build in (staleness_message, timeline_message, processes_message):
        await socket.send_json(await run_in_threadpool(build, engine, state))


async def _after_paint(socket: WebSocket, state: LiveState | None = None) -> None:
    """Wait until the page says its first charts are drawn (or a while): the histogram scans
    every row of the run and would otherwise compete with the browser for the CPU. What else
    the page says meanwhile is heeded."""
    deadline = time.monotonic() + PAINT_WAIT_S
    with contextlib.suppress(TimeoutError):
        while (left := deadline - time.monotonic()) > 0:
            text = await asyncio.wait_for(socket.receive_text(), left)
            if state is not None:
                _heed(state, text)
            if '"painted"' in text:
                return


def _heed(state: LiveState, text: str | None) -> None:
    """What the page said: ``{"type": "pause"}`` when its tab was hidden, ``"resume"`` when
    shown, ``{"type": "view", "timeline": bool}`` when the timeline came into view or left
    it; anything else (the "painted" acknowledgement, late) needs no answer."""
    if not text or len(text) > 200 or not text.startswith("{"):
        return
    with contextlib.suppress(ValueError, AttributeError):
        said = json.loads(text)
        kind = said.get("type")
        if kind in ("pause", "resume"):
            state.paused = kind == "pause"
        elif kind == "view":
            wanted = said.get("timeline") is True
            if wanted and not state.timeline_wanted:
                state.timeline_at = 0.0  # in view again: with the next delta
            state.timeline_wanted = wanted


async def _idle(socket: WebSocket, seconds: float, state: LiveState | None = None) -> None:
    """Wait ``seconds`` between polls, listening meanwhile: raises WebSocketDisconnect as soon
    as the page leaves or the server closes the socket (shutting down), so that a loop that
    seldom sends never outlives its connection and Ctrl-C is not held up by an open tab."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = await asyncio.wait_for(socket.receive(), left)
        except TimeoutError:
            return
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if state is not None:
            was = state.paused
            _heed(state, message.get("text"))
            if was and not state.paused:
                return  # shown again: catch up at once


async def _push_loop(socket: WebSocket, engine: Engine, state: LiveState) -> None:
    while True:
        status = state.marker["summary"]["status"]
        await _idle(socket, POLL_S if status == "running" else ENDED_POLL_S, state)
        if state.paused:
            continue
        change = await run_in_threadpool(delta, engine, state)
        if change is None:
            continue
        if change.get("resnapshot"):
            message, fresh = await run_in_threadpool(snapshot, engine, state.run_id)
            state.__dict__.update({**fresh.__dict__, "paused": state.paused,
                                   "timeline_wanted": state.timeline_wanted})
            await socket.send_json(message)
            await _below_the_fold(socket, engine, state)
            continue
        await socket.send_json(change)


async def serve_runs(socket: WebSocket, engine: Engine) -> None:
    """The runs list, whole, whenever it changed (a live run's duration changes every poll).

    The runs page and the compare page listen here; the list is small (one row per run, the
    recorder keeps iteration counts in it), so resending it whole is simpler than diffing.
    """
    await socket.accept()
    sent: list[dict[str, Any]] | None = None
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            try:
                runs = await run_in_threadpool(lambda: [r.to_dict() for r in list_runs(engine)])
            except PsctlError as exc:
                await socket.send_json({"type": "error", "message": str(exc)})
                runs = None
            if runs is not None and runs != sent:
                await socket.send_json({"type": "runs", "runs": runs})
                sent = runs
            await _idle(socket, RUNS_POLL_S)
