"""The metrics a run's own code logged (``psctl.log``), for the run page's charts of them
(``static/user_metrics.js``): each metric's series per process, downsampled."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request

from engine.db.queries import resolve_run
from engine.db.user_metrics import DEFAULT_POINTS, MAX_POINTS, metric_series, run_clock
from engine.errors import RunNotFound, StoreError
from webui.api import store

router = APIRouter(prefix="/api")


@router.get("/runs/{selector}/user-metrics",
            summary="The metrics the run's code logged (psctl.log), a series per process")
def user_metrics(
    request: Request,
    selector: str,
    points: int = Query(DEFAULT_POINTS, ge=10, le=MAX_POINTS,
                        description="at most this many points per series: consecutive "
                                    "iterations are averaged where there are more"),
) -> dict[str, Any]:
    engine = store(request)
    try:
        run_id = resolve_run(engine, selector)
        clock, status = run_clock(engine, run_id)
        found = metric_series(engine, run_id, points)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except StoreError as exc:  # an ambiguous selector is the caller's to fix
        raise HTTPException(400, str(exc)) from None
    # The clock the page's time axis reads (PS.trainingS), as the run page's own charts do.
    return {"run_id": run_id, "started_at": clock.started_at, "clock": clock.to_dict(),
            "status": status, "points": points,
            "metrics": [{"name": name, "series": [s.to_dict() for s in series]}
                        for name, series in found.items()]}
