"""The live dashboard: HTML pages, the JSON API (:mod:`webui.api`) and the websocket push
(:mod:`webui.live`), all reading the experiments database read-only.

Plotly's JavaScript is served from the installed ``plotly`` Python package, and Swagger UI's
(``/docs``) from the ``fastapi-offline`` package, so no CDN is contacted and no third-party
JavaScript lives in this repository.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import sys
import sysconfig
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import Engine

from engine.db import open_engine
from engine.db.queries import resolve_run
from engine.errors import PsctlError, RunNotFound
from webui import compare_api, live, logs_api, runs_api, user_metrics_api
from webui.api import router
from webui.guard import LOOPBACK_NAMES, HostOriginGuard

HERE = Path(__file__).resolve().parent


def templates_dir() -> Path:
    """The project's top-level ``templates/`` folder.

    From a checkout (and so an editable install) it lies beside this package; a wheel installs
    it as data files under ``<prefix>/share/psctl/templates`` (see pyproject.toml).
    """
    candidates = (HERE.parent / "templates",
                  Path(sysconfig.get_path("data")) / "share" / "psctl" / "templates",
                  Path(sys.prefix) / "share" / "psctl" / "templates")
    for folder in candidates:
        if (folder / "base.html").is_file():
            return folder
    raise RuntimeError(f"the dashboard's templates are missing (looked in "
                       f"{', '.join(map(str, candidates))}); reinstall psctl")


templates = Jinja2Templates(directory=templates_dir())


def plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


class _GzippedPlotly:
    """plotly.min.js (4.8 MB) gzipped once (1.4 MB), kept in memory and in the user's cache
    folder so that the next server start only reads it. Compressed in a thread started with
    the app: until it is ready the plain file is served, so no request waits for it."""

    def __init__(self, source: Path) -> None:
        self.source = source
        stat = source.stat()
        # The version in the URL makes the file immutable for browsers: a new plotly, a new URL.
        self.version = f"{_plotly_version()}-{stat.st_size}-{int(stat.st_mtime)}"
        self.body: bytes | None = None
        threading.Thread(target=self._load, name="plotly-gzip", daemon=True).start()

    def _load(self) -> None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "psctl"
        path = cache / f"plotly-{self.version}.min.js.gz"
        with contextlib.suppress(OSError):
            self.body = path.read_bytes()
            return
        body = gzip.compress(self.source.read_bytes(), compresslevel=9, mtime=0)
        self.body = body
        with contextlib.suppress(OSError):  # a read-only home only costs the next start 1 s
            cache.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(body)
            partial.replace(path)


def _plotly_version() -> str:
    import plotly

    return str(plotly.__version__)


def swagger_assets() -> Path:
    """Swagger UI's JavaScript and CSS, as the ``fastapi-offline`` package ships them."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


class _LazyEngine:
    """Opens the database on first use (it may not exist when the server starts) and keeps it."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = open_engine(self.db, readonly=True)
            return self._engine

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None


def create_app(db: Path, hosts: Sequence[str] = LOOPBACK_NAMES) -> FastAPI:
    """The dashboard over ``db``, answering only requests for ``hosts`` (see
    :func:`webui.guard.served_names`) and same-origin writes and websockets."""
    engine = _LazyEngine(Path(db))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    # FastAPI's own /docs and /redoc load their assets from a CDN; /docs is served below.
    app = FastAPI(title="psctl dashboard", version="0.2.0", lifespan=lifespan,
                  description="Views of the psctl experiments database. The only writes are a "
                              "run's tags and notes (PUT, from the runs table), made through "
                              "the recorder.",
                  docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.db = Path(db)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_middleware(HostOriginGuard, names=hosts)
    app.include_router(router)
    app.include_router(compare_api.router)
    app.include_router(runs_api.router)
    app.include_router(logs_api.router)
    app.include_router(user_metrics_api.router)  # psctl.log's metrics, for the run page
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.mount("/vendor/swagger", StaticFiles(directory=swagger_assets()), name="swagger")
    _add_pages(app, engine)
    return app


def _add_pages(app: FastAPI, engine: _LazyEngine) -> None:
    gzipped = _GzippedPlotly(plotly_js())
    # Pages ask for /vendor/plotly.min.js?v=<version>: cached for a year without revalidation.
    templates.env.globals["plotly_url"] = f"/vendor/plotly.min.js?v={gzipped.version}"

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly(request: Request, v: str = "") -> Response:
        cache = ("public, max-age=31536000, immutable" if v == gzipped.version
                 else "public, max-age=86400")
        headers = {"Cache-Control": cache, "Vary": "Accept-Encoding"}
        body = gzipped.body
        if body is not None and "gzip" in request.headers.get("accept-encoding", ""):
            return Response(body, media_type="text/javascript",
                            headers={**headers, "Content-Encoding": "gzip"})
        return FileResponse(plotly_js(), media_type="text/javascript", headers=headers)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        # validatorUrl: Swagger UI would otherwise send the schema to validator.swagger.io.
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
            swagger_js_url="/vendor/swagger/swagger-ui-bundle.js",
            swagger_css_url="/vendor/swagger/swagger-ui.css",
            swagger_favicon_url="/vendor/swagger/favicon.png",
            swagger_ui_parameters={"validatorUrl": None})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def runs_page(request: Request) -> Any:
        return templates.TemplateResponse(request, "runs.html", {"db": str(app.state.db)})

    @app.get("/runs/{selector}", response_class=HTMLResponse, include_in_schema=False)
    def run_page(request: Request, selector: str) -> Any:
        run_id = _resolve(engine, selector)
        return templates.TemplateResponse(request, "run.html", {"run_id": run_id})

    @app.get("/compare", response_class=HTMLResponse, include_in_schema=False)
    def compare_page(request: Request, runs: str = "", group: str = "") -> Any:
        ids = [_resolve(engine, s) for s in runs.split(",") if s.strip()]
        if group:  # every run of a group of repeated runs (launch --repeat tags them)
            ids += compare_api.group_run_ids(engine, group)
        return templates.TemplateResponse(
            request, "compare.html", {"run_ids": list(dict.fromkeys(ids)), "group": group})

    @app.websocket("/ws/runs")
    async def runs_socket(socket: WebSocket) -> None:
        store = await _store_or_close(engine, socket)
        if store is not None:
            await live.serve_runs(socket, store)

    @app.websocket("/ws/runs/{run_id}")
    async def run_socket(socket: WebSocket, run_id: str) -> None:
        store = await _store_or_close(engine, socket)
        if store is not None:
            await live.serve(socket, store, run_id)


async def _invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    """422 naming each refused parameter and why, in one short line: FastAPI's own answer
    echoes every refused value whole, a pasted megabyte included."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    problems = [f"{'.'.join(map(str, e['loc'][1:])) or e['loc'][0]}: {e['msg']}" for e in errors]
    return JSONResponse({"detail": "; ".join(problems) or "invalid request"}, status_code=422)


async def _store_or_close(engine: _LazyEngine, socket: WebSocket) -> Engine | None:
    """The database, or None once the page has been told why there is none (no runs yet)."""
    try:
        return engine()
    except PsctlError as exc:
        await socket.accept()
        await socket.send_json({"type": "error", "message": str(exc)})
        await socket.close()
        return None


def _resolve(engine: _LazyEngine, selector: str) -> str:
    try:
        return resolve_run(engine(), selector)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except PsctlError as exc:
        raise HTTPException(503, str(exc)) from None
