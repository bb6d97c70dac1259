"""The runs table's API: per-run metrics for sorting, config filters, grouping by a config key,
run column or tag, and tag and note edits (written through :mod:`engine.recorder`, the one module
that writes the database)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import Engine

from engine.analysis.cells import cell
from engine.analysis.compare import compare
from engine.analysis.groups import GROUP_TAG
from engine.analysis.selection import RUN_COLUMNS, UsageError, flatten, lookup, select_runs, text
from engine.analysis.table import DEFAULT_TARGET
from engine.db.metrics import RunMetrics, RunRecord, run_metrics
from engine.db.queries import quoted, resolve_run
from engine.db.schema import translate_errors
from engine.errors import PsctlError, RunNotFound, StoreError
from engine.recorder import NOTES_MAX_CHARS, set_notes, set_tags
from engine.recorder.admin import TAG_KEY_MAX, TAG_VALUE_MAX, TAGS_MAX
from engine.wire.records import RunStatus
from psctl import settings
from webui.api import store
from webui.compare_api import backend
from webui.guard import same_origin

router = APIRouter(prefix="/api")

WRITE_HEADER = "x-psctl-write"
MAX_WHERE = 20
MAX_CONDITION = 200
# The metrics of an ended run never change: measured once (two scans of its iterations), then
# served from memory. Bounded, so a database of many thousands of runs cannot grow it forever.
CACHED_RUNS = 4096
_ENDED = {RunStatus.FINISHED.value, RunStatus.FAILED.value, RunStatus.INTERRUPTED.value}
# The table's metric columns, in order; the page sorts on their raw values.
TABLE_COLUMNS = ("wall_s", "final_accuracy", "best_accuracy", "time_to_target_s", "startup_s",
                 "samples_per_s", "idle_fraction", "staleness_mean", "staleness_p95",
                 "bytes_per_sample", "oversubscribed")
# A group's config keys that differ between its runs, for its parallel-coordinates view: more
# axes than this are unreadable, so the rest are only counted. The run name is no setting.
MAX_VARYING = 12
_NOT_A_SETTING = {"name"}


class MetricsCache:
    """run id and target -> RunMetrics of runs that have ended, least recently used dropped."""

    def __init__(self, size: int = CACHED_RUNS) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, float | None], RunMetrics] = OrderedDict()
        self._lock = threading.Lock()  # sync endpoints run in a thread pool

    def measure(self, engine: Engine, run_id: str, target: float | None, ended: bool) -> \
            RunMetrics:
        key = (run_id, target)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        metrics = run_metrics(engine, run_id, target=target)
        if ended:
            with self._lock:
                self._items[key] = metrics
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return metrics


def _cache(request: Request) -> MetricsCache:
    cache = getattr(request.app.state, "metrics_cache", None)
    if cache is None:  # one per app; created on first use so that create_app need not know it
        cache = request.app.state.metrics_cache = MetricsCache()
    assert isinstance(cache, MetricsCache)
    return cache


async def _write_body(request: Request) -> dict[str, Any]:
    """The JSON object of a write request, refused unless it can only come from our own page.

    The dashboard listens on 127.0.0.1, so any web page the user visits could POST to it: a
    custom header and a JSON content type cannot be sent cross-site without a CORS preflight
    (which we never grant), and a present Origin must be ours.
    """
    if request.headers.get(WRITE_HEADER) != "1":
        raise HTTPException(403, f"writes need the header {WRITE_HEADER}: 1")
    origin = request.headers.get("origin")
    if origin is not None and not same_origin(origin, request.headers.get("host", "")):
        raise HTTPException(403, "cross-site writes are refused")
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise HTTPException(415, "the body must be application/json")
    raw = await request.body()
    if len(raw) > 4 * NOTES_MAX_CHARS + 1024:
        raise HTTPException(413, "body too large")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise HTTPException(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


def _resolve(request: Request, selector: str) -> str:
    try:
        return resolve_run(store(request), selector)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except StoreError as exc:  # an ambiguous selector is the caller's to fix
        raise HTTPException(400, str(exc)) from None


def _tag_changes(body: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    values = body.get("set", {})
    remove = body.get("remove", [])
    if set(body) - {"set", "remove"}:
        raise HTTPException(400, 'only "set" and "remove" are accepted')
    if not isinstance(values, dict) or not isinstance(remove, list):
        raise HTTPException(400, '"set" must be an object and "remove" a list')
    if len(values) + len(remove) > TAGS_MAX:
        raise HTTPException(400, f"at most {TAGS_MAX} tags per request")
    for key in [*values, *remove]:
        if not isinstance(key, str) or not 0 < len(key) <= TAG_KEY_MAX:
            raise HTTPException(400, f"tag keys are 1 to {TAG_KEY_MAX} characters")
    for value in values.values():
        if not isinstance(value, str) or len(value) > TAG_VALUE_MAX:
            raise HTTPException(400, f"tag values are strings of at most {TAG_VALUE_MAX} chars")
    return values, remove


def _current(request: Request, run_id: str) -> dict[str, Any]:
    with store(request).connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT key, value FROM tags WHERE run_id = ? ORDER BY key", (run_id,)).all()
        tags = {str(key): str(value) for key, value in rows}
        notes = conn.exec_driver_sql(
            "SELECT notes FROM runs WHERE id = ?", (run_id,)).scalar()
    return {"id": run_id, "tags": tags, "notes": notes}


@router.put("/runs/{selector}/tags", summary="Set and remove tags of one run")
async def put_tags(request: Request, selector: str) -> dict[str, Any]:
    values, remove = _tag_changes(await _write_body(request))
    run_id = _resolve(request, selector)
    try:
        set_tags(request.app.state.db, run_id, values, remove)
    except StoreError as exc:
        raise HTTPException(503, str(exc)) from None
    return _current(request, run_id)


@router.put("/runs/{selector}/notes", summary="Replace the notes of one run")
async def put_notes(request: Request, selector: str) -> dict[str, Any]:
    body = await _write_body(request)
    notes = body.get("notes")
    if set(body) != {"notes"} or not (notes is None or isinstance(notes, str)):
        raise HTTPException(400, 'the body must be {"notes": "..."}')
    if notes is not None and len(notes) > NOTES_MAX_CHARS:
        raise HTTPException(400, f"notes are limited to {NOTES_MAX_CHARS} characters")
    run_id = _resolve(request, selector)
    try:
        set_notes(request.app.state.db, run_id, notes)
    except StoreError as exc:
        raise HTTPException(503, str(exc)) from None
    return _current(request, run_id)


@router.get("/table", summary="Every run with its metrics, for the runs table")
def runs_table(
    request: Request,
    where: Annotated[list[str] | None, Query(
        max_length=MAX_WHERE,
        description="KEY=VALUE: keep runs whose config key, column or tag matches (repeatable)",
    )] = None,
    target: float = Query(DEFAULT_TARGET, gt=0, le=1, allow_inf_nan=False,
                          description="accuracy (0-1] for the time-to-target column"),
    group_by: str | None = Query(None, min_length=1, max_length=MAX_CONDITION,
                                 description="a config key (optimizer.lr), run column (sync) "
                                             "or tag (tag.study): rows get its value, and "
                                             "``groups`` the settings that vary in each group"),
) -> dict[str, Any]:
    """One row per run, oldest first: its summary, backend (``sim``: virtual time), tags, notes
    and the metrics ``psctl compare --per-run`` computes (raw in ``values``, formatted as the
    terminal prints them in ``cells``). A filter that matches nothing is an empty table with a
    ``message``. With ``group_by``, each row has its ``group_value`` and ``config`` (the
    settings that vary within its group), and ``groups`` lists the groups, largest first."""
    conditions = _conditions(where or [])
    engine = store(request)
    try:
        records = select_runs(engine, [], conditions, crash_after_s=settings.crash_after_s())
    except RunNotFound as exc:
        return {"target": target, "rows": [], "message": str(exc), "config_keys": [],
                "tag_keys": [], "group_by": group_by, "groups": []}
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    except PsctlError as exc:
        raise HTTPException(503, str(exc)) from None
    if group_by is not None:
        _check_group_key(group_by, records)
    ended = {r.summary.id for r in records if r.summary.status in _ENDED}
    cache = _cache(request)
    try:
        table = compare(engine, records, target=target, measure=lambda run_id, goal:
                        cache.measure(engine, run_id, goal, run_id in ended))
        notes = _notes(engine)
    except StoreError as exc:
        raise HTTPException(503, str(exc)) from None
    columns = {c.key: c for c in table.columns}
    rows = []
    for record, row in zip(records, table.rows, strict=True):
        run = record.summary
        rows.append({
            "id": run.id, "name": run.name, "status": run.status, "sync": run.sync,
            "workers": run.workers, "servers": run.servers, "dataset": run.dataset,
            "started_at": run.started_at, "iterations": run.iterations,
            "tags": record.tags, "group": record.tags.get(GROUP_TAG),
            "backend": backend(record), "notes": notes.get(run.id),
            "values": {k: row.get(k) for k in TABLE_COLUMNS},
            "cells": {k: cell(columns[k], row) for k in TABLE_COLUMNS if k in columns},
        })
    keys = sorted({k for r in records for k in flatten(r.config)})
    tag_keys = sorted({f"tag.{k}" for r in records for k in r.tags})
    groups = [] if group_by is None else _groups(group_by, records, rows)
    return {"target": target, "rows": rows, "message": None, "config_keys": keys,
            "tag_keys": tag_keys, "group_by": group_by, "groups": groups}


def _check_group_key(key: str, records: list[RunRecord]) -> None:
    """``group_by`` names one thing exactly: a config key some run has, a run column, or a tag
    some run carries (no leaf-name guessing, as ``--where`` does: a group must be unambiguous)."""
    if key in RUN_COLUMNS:
        return
    if key.startswith("tag."):
        if any(key.removeprefix("tag.") in r.tags for r in records):
            return
        raise HTTPException(400, f"no run has the tag {quoted(key.removeprefix('tag.')[:40])}")
    known = {k for r in records for k in flatten(r.config)}
    if key not in known:
        raise HTTPException(400, f"group_by takes a config key, run column or tag.KEY, got "
                                 f"{quoted(key[:40])}; e.g. sync, optimizer.lr, tag.group")


def _groups(key: str, records: list[RunRecord], rows: list[dict[str, Any]]) -> \
        list[dict[str, Any]]:
    """Each distinct value of ``key`` (runs without it together, value None), largest group
    first: its run ids and the config keys whose values differ between them (at most
    MAX_VARYING, alphabetical; ``more_varying`` counts the rest). Each row gets its value and
    its own values of its group's varying keys."""
    members: dict[str, list[tuple[RunRecord, dict[str, Any]]]] = {}
    values: dict[str, Any] = {}
    for record, row in zip(records, rows, strict=True):
        found, value = lookup(record, key)
        value = value if found else None
        label = text(value)
        members.setdefault(label, []).append((record, row))
        values[label] = value
        row["group_value"] = value
    groups = []
    for label, runs in sorted(members.items(), key=lambda item: -len(item[1])):
        flats = [flatten(r.config) for r, _ in runs]
        varying = sorted(k for k in {k for f in flats for k in f} - _NOT_A_SETTING - {key}
                         if len({text(f.get(k)) for f in flats}) > 1)
        shown = varying[:MAX_VARYING]
        for flat, (_, row) in zip(flats, runs, strict=True):
            row["config"] = {k: flat.get(k) for k in shown}
        groups.append({"value": values[label], "label": label,
                       "runs": [r.summary.id for r, _ in runs], "varying": shown,
                       "more_varying": len(varying) - len(shown)})
    return groups


def _conditions(where: list[str]) -> list[str]:
    for condition in where:
        if len(condition) > MAX_CONDITION:
            raise HTTPException(422, f"a where condition is at most {MAX_CONDITION} characters")
        if "=" not in condition:
            raise HTTPException(400, f"where takes KEY=VALUE, got {quoted(condition[:40])}")
    return where


def _notes(engine: Engine) -> dict[str, str]:
    with translate_errors("reading the notes of runs"), engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, notes FROM runs WHERE notes IS NOT NULL").all()
    return {str(run_id): str(text) for run_id, text in rows}
