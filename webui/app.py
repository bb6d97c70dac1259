"""A minimal read-only JSON API over the experiments database; the live dashboard grows here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException

from engine.db import open_engine
from engine.db.queries import list_runs, resolve_run, run_detail
from engine.errors import RunNotFound, StoreError


def create_app(db: Path) -> FastAPI:
    app = FastAPI(title="psctl dashboard", version="0.1.0")

    def engine() -> Any:
        try:
            return open_engine(db, readonly=True)
        except StoreError as exc:
            raise HTTPException(503, str(exc)) from None

    @app.get("/api/runs")
    def runs(status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return [run.to_dict() for run in list_runs(engine(), status=status, limit=limit)]

    @app.get("/api/runs/{selector}")
    def run(selector: str) -> dict[str, Any]:
        store = engine()
        try:
            return run_detail(store, resolve_run(store, selector)).to_dict()
        except RunNotFound as exc:
            raise HTTPException(404, str(exc)) from None

    return app
