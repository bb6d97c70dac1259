"""The compare page's API: the table ``psctl compare --json`` prints, for the runs shown.

The table is built by :func:`engine.analysis.compare.comparison_for`, the function the CLI calls, so
the page can never disagree with ``psctl compare --json`` for the same arguments (groups of
repeated runs included). Each cell also comes formatted by the terminal table's own rules,
so the page does not re-implement them in JavaScript.

Each run also comes with its clock (:mod:`engine.db.clock`): when its first iteration started,
its start-up and the spans a resumed run was down, so that the page's charts count training time
from the first iteration, start-up apart, as ``psctl compare`` and ``psctl plot`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import Engine

from engine.analysis.cells import cell, json_rows, shown_columns
from engine.analysis.compare import best_values, comparison_for
from engine.analysis.groups import GROUP_TAG
from engine.analysis.selection import UsageError, select_runs
from engine.db.clock import training_clock
from engine.db.metrics import RunRecord
from engine.db.queries import quoted
from engine.db.schema import translate_errors
from engine.errors import AmbiguousRun, PsctlError, RunNotFound, StoreError
from psctl import settings
from webui.api import store

router = APIRouter(prefix="/api")

# Bounds on what one request may ask for: a selector or condition longer than any run name or
# config key is a mistake, and hundreds of runs would not fit a chart or a table anyway.
MAX_SELECTOR = 200
MAX_RUNS = 100
MAX_WHERE = 20
MAX_SORT_KEY = 64
MAX_TOP = 10_000
MAX_METRIC = 64  # a logged metric's name (psctl.log); longer is a mistake

Selector = Annotated[str | None, Query(max_length=MAX_SELECTOR)]


@router.get("/compare", summary="The `psctl compare --json` table of some runs")
def compare_runs(
    request: Request,
    runs: str = Query("", max_length=MAX_RUNS * (MAX_SELECTOR + 1),
                      description="comma-separated run selectors (id, prefix, name, @last~N); "
                                  "all runs if empty"),
    where: Annotated[list[str] | None, Query(
        max_length=MAX_WHERE,
        description="KEY=VALUE: keep runs whose config key, column or tag matches (repeatable)",
    )] = None,
    target: float | None = Query(None, gt=0, le=1, allow_inf_nan=False,
                                 description="accuracy (0-1] for the time-to-target column"),
    baseline: Selector = None,
    sort_by: str | None = Query(None, max_length=MAX_SORT_KEY),
    top: int | None = Query(None, ge=0, le=MAX_TOP),
    per_run: bool = Query(False, description="a row per run, also for runs of a group"),
    metric: str | None = Query(None, min_length=1, max_length=MAX_METRIC,
                               description="a metric the runs' code logged (psctl.log): its "
                                           "final and mean value as two more columns"),
) -> dict[str, Any]:
    """``rows`` are exactly ``psctl compare --json``'s output for the same arguments; ``cells``
    the same rows formatted as the terminal table prints them (a group's ``mean ± std``);
    ``runs`` the selected runs themselves, with the group each belongs to, their backend
    (``sim``: virtual time) and their clock (``first_iteration_at``, ``startup_s``,
    ``downtime``)."""
    selectors = _selectors(runs)
    where = where or []
    for condition in where:
        if len(condition) > MAX_SELECTOR:
            raise HTTPException(422, f"a where condition is at most {MAX_SELECTOR} characters")
        if "=" not in condition:
            raise HTTPException(400, f"where takes KEY=VALUE, got {quoted(condition[:40])}")
    engine = store(request)
    try:
        table = comparison_for(engine, selectors, where, target=target, baseline=baseline,
                               sort_by=sort_by, top=top, per_run=per_run,
                               crash_after_s=settings.crash_after_s(), metric=metric)
        records = select_runs(engine, selectors, where, crash_after_s=settings.crash_after_s())
        clocks = _clocks(engine, records)
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    except AmbiguousRun as exc:  # the caller's to fix, as with an unknown key
        raise HTTPException(400, str(exc)) from None
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except StoreError as exc:
        raise HTTPException(503, str(exc)) from None
    except PsctlError as exc:  # e.g. a malformed PSCTL_CRASH_AFTER_S: the server's, not a 500
        raise HTTPException(503, str(exc)) from None
    shown = shown_columns(table)
    return {
        "columns": [{"key": c.key, "header": c.header, "kind": c.kind, "better": c.better}
                    for c in table.columns],
        "rows": json_rows(table),
        "cells": [{c.key: cell(c, row) for c in shown} for row in table.rows],
        "best": best_values(table),
        "target": table.target,
        "runs": [{"id": r.summary.id, "name": r.summary.name, "sync": r.summary.sync,
                  "workers": r.summary.workers, "servers": r.summary.servers,
                  "status": r.summary.status, "group": r.tags.get(GROUP_TAG),
                  "backend": backend(r), "started_at": r.summary.started_at,
                  **clocks[r.summary.id]}
                 for r in records],
    }


def backend(record: RunRecord) -> str:
    """Where the run's roles ran (``sim``: the simulated cluster, whose times are virtual)."""
    cluster = record.config.get("cluster")
    value = cluster.get("backend") if isinstance(cluster, dict) else None
    return value if isinstance(value, str) else "local"


def _clocks(engine: Engine, records: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """run id -> its clock (engine/db/clock.py): when its first iteration started (None
    without one), its start-up seconds and a resumed run's downtime spans; index lookups only."""
    with translate_errors("reading the runs' clocks"), engine.connect() as conn:
        return {r.summary.id: training_clock(conn, r.summary.id, r.summary.started_at).to_dict()
                for r in records}


def _selectors(runs: str) -> list[str]:
    selectors = [s.strip() for s in runs.split(",") if s.strip()]
    if len(selectors) > MAX_RUNS:
        raise HTTPException(422, f"compare at most {MAX_RUNS} runs at once")
    if any(len(s) > MAX_SELECTOR for s in selectors):
        raise HTTPException(422, f"a run selector is at most {MAX_SELECTOR} characters")
    return list(dict.fromkeys(selectors))


def group_run_ids(opener: Callable[[], Engine], group: str) -> list[str]:
    """The runs tagged ``group=<group>`` (``psctl launch --repeat`` tags them so), oldest first,
    for the page ``/compare?group=NAME``; an unknown group is a 404."""
    if len(group) > MAX_SELECTOR:
        raise HTTPException(422, f"a group name is at most {MAX_SELECTOR} characters")
    try:
        records = select_runs(opener(), [], [f"tag.{GROUP_TAG}={group}"],
                              crash_after_s=settings.crash_after_s())
    except RunNotFound:
        raise HTTPException(404, f"no run is tagged {GROUP_TAG}={quoted(group[:40])}") from None
    except (PsctlError, UsageError) as exc:
        raise HTTPException(503, str(exc)) from None
    return [r.summary.id for r in records]
