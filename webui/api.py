"""The dashboard's read-only JSON API (documented at ``/docs``) and full-fidelity downloads."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import Engine

from engine.db import series
from engine.db.queries import SQLITE_INT_MAX, list_runs, quoted, resolve_run, run_detail
from engine.errors import RunNotFound, StoreError
from webui.metrics import EVALUATION_METRICS, METRICS, derive, metric_series, raw_value

router = APIRouter(prefix="/api")
ALL_METRICS = (*METRICS, *EVALUATION_METRICS)

# Query parameters are bounded here, before any query runs: out of range they would overflow
# in the SQLite driver or in bucket arithmetic (a 500) instead of being refused (a 422).
# Later than any recorded time (the year 5138), and small enough that the bucket numbers
# computed from it stay far inside SQLite's integers.
LATEST_TIME_S = 1e11
# Wider than any run; the rollup slots of a wider bucket would not fit SQLite's integers.
WIDEST_BUCKET_S = 1e9
RowIndex = Annotated[int, Query(ge=0, le=SQLITE_INT_MAX)]


def store(request: Request) -> Engine:
    opener: Callable[[], Engine] = request.app.state.engine
    try:
        return opener()
    except StoreError as exc:
        raise HTTPException(503, str(exc)) from None


def run_of(request: Request, selector: str) -> tuple[Engine, str]:
    """The database and the id of the run a selector names (404 when there is none, 400 when
    it is ambiguous): every run endpoint starts here."""
    engine = store(request)
    try:
        return engine, resolve_run(engine, selector)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except StoreError as exc:  # an ambiguous selector is the caller's to fix
        raise HTTPException(400, str(exc)) from None


@router.get("/runs", summary="Recorded runs, newest first")
def runs(
    request: Request,
    status: str | None = None,
    limit: int | None = Query(None, ge=0, le=SQLITE_INT_MAX),
) -> list[dict[str, Any]]:
    try:
        return [run.to_dict() for run in list_runs(store(request), status=status, limit=limit)]
    except StoreError as exc:
        raise HTTPException(400 if "unknown run status" in str(exc) else 503, str(exc)) from None


@router.get("/runs/{selector}", summary="One run: summary, config, per-worker statistics")
def run(request: Request, selector: str) -> dict[str, Any]:
    engine, run_id = run_of(request, selector)
    return run_detail(engine, run_id).to_dict()


@router.get("/runs/{selector}/series/{metric}", summary="One metric, downsampled")
def metric(
    request: Request,
    selector: str,
    metric: str,
    since: float | None = Query(None, ge=0, le=LATEST_TIME_S, allow_inf_nan=False,
                                description="unix time: only points after it (deltas)"),
    width: float | None = Query(None, ge=series.MIN_WIDTH_S, le=WIDEST_BUCKET_S,
                                allow_inf_nan=False,
                                description="bucket width in s (keep it for deltas)"),
    max_points: int = Query(series.DEFAULT_BUCKETS, ge=10, le=20000),
) -> dict[str, Any]:
    """Iteration metrics come as time buckets of ``width`` seconds per worker and for all
    workers, each with its minimum and maximum where that matters (staleness, loss);
    ``points_total`` is the number of raw rows they summarise. Evaluations come raw."""
    engine, run_id = run_of(request, selector)
    if metric in EVALUATION_METRICS:
        return _evaluation_metric(engine, run_id, metric, since)
    if metric not in METRICS:
        raise _unknown_metric(metric)
    head = series.iteration_buckets(engine, run_id, width=width, since=since,
                                    buckets=max_points)
    records = derive(head)
    body = metric_series(metric, records, head.origin)
    shown = sum(len(s["t"]) for k, s in body["series"].items() if k != "all")
    return {**body, "run_id": run_id, "origin": head.origin, "width": head.width,
            "points_shown": shown, "points_total": head.total_rows}


def _unknown_metric(metric: str) -> HTTPException:
    return HTTPException(404, f"unknown metric {quoted(metric)}; one of {', '.join(ALL_METRICS)}")


def _evaluation_metric(engine: Engine, run_id: str, metric: str, since: float | None) -> \
        dict[str, Any]:
    unit, title = EVALUATION_METRICS[metric]
    column = "accuracy" if metric == "accuracy" else "loss"
    points = [e for e in series.evaluations_since(engine, run_id)
              if since is None or e["at"] > since]
    one = {"t": [e["at"] for e in points], "elapsed_s": [e["elapsed_s"] for e in points],
           "iteration": [e["step"] for e in points], column: [e[column] for e in points]}
    return {"metric": metric, "title": title, "unit": unit, "series": {"all": one},
            "run_id": run_id, "points_shown": len(points), "points_total": len(points)}


@router.get("/runs/{selector}/syncs", summary="ElasticBSP barriers (empty for other models)")
def syncs(request: Request, selector: str, from_index: RowIndex = 0) -> list[dict[str, Any]]:
    engine, run_id = run_of(request, selector)
    return series.syncs_from(engine, run_id, from_index)


@router.get("/runs/{selector}/events", summary="Events, oldest first")
def events(request: Request, selector: str, after_id: RowIndex = 0) -> list[dict[str, Any]]:
    engine, run_id = run_of(request, selector)
    return series.events_since(engine, run_id, after_id)


@router.get("/runs/{selector}/staleness", summary="Staleness histogram per worker")
def staleness(request: Request, selector: str) -> list[dict[str, int]]:
    engine, run_id = run_of(request, selector)
    return [{"worker": w, "staleness": s, "count": n}
            for w, s, n in series.staleness_histogram(engine, run_id)]


# -- downloads (every row, streamed) -------------------------------------------------------------


@router.get("/runs/{selector}/iterations.{fmt}", summary="Every iteration row (csv or json)")
def iterations_download(request: Request, selector: str, fmt: str) -> StreamingResponse:
    engine, run_id = run_of(request, selector)
    rows = series.iter_iterations(engine, run_id)
    return _download(series.ITERATION_COLUMNS, rows, fmt, f"{run_id}-iterations")


@router.get("/runs/{selector}/series/{metric}/full.{fmt}",
            summary="One metric at full fidelity: one value per iteration or evaluation")
def metric_download(request: Request, selector: str, metric: str, fmt: str) -> StreamingResponse:
    engine, run_id = run_of(request, selector)
    if metric in EVALUATION_METRICS:
        column = "accuracy" if metric == "accuracy" else "loss"
        evals = series.evaluations_since(engine, run_id)
        rows: Iterable[tuple[Any, ...]] = ((e["at"], e["elapsed_s"], e["step"], e[column])
                                           for e in evals)
        return _download(("at", "elapsed_s", "step", metric), rows, fmt, f"{run_id}-{metric}")
    if metric not in METRICS:
        raise _unknown_metric(metric)
    names = series.ITERATION_COLUMNS

    def values() -> Iterator[tuple[Any, ...]]:
        for row in series.iter_iterations(engine, run_id):
            d = dict(zip(names, row, strict=True))
            yield d["worker"], d["iteration"], d["ended_at"], raw_value(metric, d)

    return _download(("worker", "iteration", "ended_at", metric), values(), fmt,
                     f"{run_id}-{metric}")


def _download(columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]], fmt: str,
              stem: str) -> StreamingResponse:
    if fmt not in ("csv", "json"):
        raise HTTPException(404, "download as .csv or .json")
    body = _csv_chunks(columns, rows) if fmt == "csv" else _json_chunks(columns, rows)
    media = "text/csv" if fmt == "csv" else "application/json"
    headers = {"Content-Disposition": f'attachment; filename="{stem}.{fmt}"'}
    return StreamingResponse(body, media_type=media, headers=headers)


def _csv_chunks(columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for i, row in enumerate(rows):
        writer.writerow(row)
        if i % 2000 == 1999:  # chunks of a few hundred kB, not one write per row
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _json_chunks(columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> Iterator[str]:
    yield "["
    for i, row in enumerate(rows):
        item = json.dumps(dict(zip(columns, row, strict=True)))
        yield item if i == 0 else "," + item
    yield "]"
