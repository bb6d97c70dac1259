"""A run's role logs over HTTP: which there are, and the tail of one (the run page's viewer).

``psctl launch`` writes one log per process into the run's folder, ``psctl-logs/<run id>``
beside the database (``<role>-<rank>.log`` for workers and servers, ``<role>.log`` for the
coordinator and the evaluator; a simulated run writes ``sim.log`` when it fails). The folder is
found from what the run recorded (the coordinator's ``coordinator_listening`` event names it),
never from the request: a role in the URL is checked against the run's own roles and the file
name is rebuilt from the checked parts, so no text of the request reaches the file system.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy import Engine, select

from engine.db.queries import quoted, reading
from engine.db.schema import events, parse_json, runs
from webui.api import run_of

router = APIRouter(prefix="/api")

DEFAULT_TAIL_BYTES = 64 * 1024
MAX_TAIL_BYTES = 4 * 1024 * 1024  # a browser's <pre> of more is no longer read, only scrolled
# A role as the URL names it: worker-3, server-0, coordinator, evaluator or sim. The rank is
# bounded in digits so that int() of it is small; whether the run has it is checked after.
ROLE_PATTERN = re.compile(r"(worker|server)-(0|[1-9][0-9]{0,5})|coordinator|evaluator|sim")
ROLE_HELP = "a role such as worker-0, server-1, coordinator or evaluator"
# Events whose detail may say how many workers or servers a run grew to (psctl scale), and
# which ranks joined: their logs are the run's too.
_SCALE_EVENTS = ("membership", "server_membership")


@dataclass(frozen=True)
class RunLogs:
    """Where a run's logs are and which roles it has, in launch order."""

    run_id: str
    folder: Path | None  # None: the run does not say, and the default place has no folder
    roles: tuple[str, ...]


def role_file(role: str) -> str:
    """The log's file name for a checked role (``worker-3`` -> ``worker-3.log``)."""
    return f"{role}.log"


def run_logs(engine: Engine, run_id: str, db: Path) -> RunLogs:
    """The run's log folder and roles, from its row, config and events."""
    with reading(engine, f"reading the logs of run {run_id}") as conn:
        row = conn.execute(select(runs.c.workers, runs.c.servers, runs.c.config_json)
                           .where(runs.c.id == run_id)).one()
        found = conn.execute(
            select(events.c.kind, events.c.detail)
            .where(events.c.run_id == run_id,
                   events.c.kind.in_(("coordinator_listening", "resumed", *_SCALE_EVENTS)))
            .order_by(events.c.id)).all()
    config = parse_json(row.config_json)
    found_cluster = config.get("cluster")
    cluster: dict[str, Any] = found_cluster if isinstance(found_cluster, dict) else {}
    details = [(kind, parse_json(detail)) for kind, detail in found]
    workers = _count(row.workers, cluster.get("workers"),
                     *_scaled(details, "membership", "workers"))
    servers = _count(row.servers, cluster.get("servers"),
                     *_scaled(details, "server_membership", "servers"))
    if cluster.get("backend") == "sim":
        # The simulated cluster runs in the launching process; it writes only sim.log.
        roles: tuple[str, ...] = ("sim",)
    else:
        roles = ("coordinator", *(f"server-{r}" for r in range(servers)), "evaluator",
                 *(f"worker-{r}" for r in range(workers)))
    return RunLogs(run_id, _folder(details, run_id, db), roles)


def _count(*values: Any) -> int:
    return max((int(v) for v in values if isinstance(v, int) and v >= 0), default=0)


def _scaled(details: list[tuple[str, dict[str, Any]]], kind: str, key: str) -> list[int]:
    """Sizes a scaled run reached, and one past each rank that joined it."""
    out: list[int] = []
    for k, detail in details:
        if k != kind:
            continue
        size = detail.get(key)
        out.append(size if isinstance(size, int) else 0)
        joining = detail.get("joining")
        if isinstance(joining, list):
            out += [r + 1 for r in joining if isinstance(r, int)]
    return out


def _folder(details: list[tuple[str, dict[str, Any]]], run_id: str, db: Path) -> Path | None:
    """The newest folder the run recorded, else ``psctl-logs/<run id>`` beside the database
    (where psctl launch puts it, and where a simulated run, which records none, writes)."""
    recorded: list[Path] = []
    for kind, detail in details:
        folder = detail.get("folder")
        if not isinstance(folder, str) or not folder:
            continue
        if kind == "coordinator_listening":
            recorded.append(Path(folder))
        elif kind == "resumed":  # the checkpoint's folder: <run folder>/checkpoints/<seq>
            recorded.append(Path(folder).parent.parent)
    candidates = [*reversed(recorded), db.resolve().parent / "psctl-logs" / run_id]
    # A folder made for another run is never read, whatever a damaged event says.
    return next((c for c in candidates if c.name == run_id and c.is_dir()), None)


def _logs_of(request: Request, selector: str) -> RunLogs:
    engine, run_id = run_of(request, selector)
    return run_logs(engine, run_id, Path(request.app.state.db))


def _missing_folder(logs: RunLogs) -> HTTPException:
    return HTTPException(404, f"the log folder of run {logs.run_id[:8]} was not found (the run "
                              f"does not record it and psctl-logs/{logs.run_id} is not beside "
                              "the database: moved, deleted, or on another machine)")


@router.get("/runs/{selector}/logs", summary="The run's role logs: name, size, modified")
def logs(request: Request, selector: str) -> dict[str, Any]:
    """One entry per role of the run that has a log: ``role`` (``worker-0``, ``server-1``,
    ``coordinator``, ``evaluator``, ``sim``), ``size`` in bytes and ``mtime`` (unix s). Roles
    that have not written a log (not started, or restarted elsewhere) are left out; ``roles``
    lists them all; ``folder`` is where they are. A run whose folder cannot be found has no
    logs, ``folder`` null and a ``note`` that says why."""
    found = _logs_of(request, selector)
    if found.folder is None:  # an empty list that says why (the tail of a role is a 404)
        return {"run_id": found.run_id, "logs": [], "roles": list(found.roles), "folder": None,
                "note": _missing_folder(found).detail}
    entries = []
    for role in found.roles:
        path = found.folder / role_file(role)
        try:
            stat = path.stat()
        except OSError:
            continue
        entries.append({"role": role, "size": stat.st_size, "mtime": stat.st_mtime})
    return {"run_id": found.run_id, "logs": entries, "roles": list(found.roles),
            "folder": str(found.folder), "note": None}


@router.get("/runs/{selector}/logs/{role}", summary="The tail of one role's log, as text",
            response_class=PlainTextResponse)
def log_tail(
    request: Request,
    selector: str,
    role: str,
    tail: int = Query(DEFAULT_TAIL_BYTES, alias="bytes", ge=1, le=MAX_TAIL_BYTES,
                      description="how many bytes from the end of the log"),
) -> PlainTextResponse:
    """The last ``bytes`` of the log as UTF-8 text; a line cut by the start of the window is
    left out (unless it is the only one).
    Headers: ``X-Log-Size`` (the whole log's bytes) and ``X-Log-Offset`` (where the text
    starts in it; 0 when it is the whole log)."""
    match = ROLE_PATTERN.fullmatch(role)
    if match is None:
        raise HTTPException(422, f"role {quoted(role)} is not {ROLE_HELP}")
    found = _logs_of(request, selector)
    # Rebuilt from the match, not copied from the request; and one of the run's own roles.
    checked = match.group(0) if match.group(1) is None else f"{match.group(1)}-{match.group(2)}"
    if checked not in found.roles:
        raise HTTPException(404, f"run {found.run_id[:8]} has no role {checked}; its roles: "
                                 f"{', '.join(found.roles)}")
    if found.folder is None:
        raise _missing_folder(found)
    path = found.folder / role_file(found.roles[found.roles.index(checked)])
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            offset = max(0, size - tail)
            # One byte before the window too: it says whether the window starts a line.
            handle.seek(max(0, offset - 1))
            raw = handle.read(size - max(0, offset - 1))
    except FileNotFoundError:
        raise HTTPException(404, f"{checked} of run {found.run_id[:8]} wrote no log (not "
                                 "started, or its log was deleted)") from None
    except OSError as exc:
        raise HTTPException(503, f"cannot read the log of {checked}: {exc.strerror}") from None
    if offset:
        before, raw = raw[:1], raw[1:]
        if before != b"\n" and b"\n" in raw[:-1]:  # the window starts mid-line: go to the next
            cut = raw.index(b"\n") + 1
            raw, offset = raw[cut:], offset + cut
    return PlainTextResponse(raw.decode("utf-8", errors="replace"),
                             headers={"X-Log-Size": str(size), "X-Log-Offset": str(offset),
                                      "Cache-Control": "no-store"})
