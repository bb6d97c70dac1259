"""The warm template: ``python -m engine.roles.template``, one per local launch.

A fresh role process spends 1-2 CPU-seconds importing torch, numpy and psctl before its first
message (about 2 s of a worker's 0.5 s digits epoch, and most of a short test's time on two
cores). The template imports them once, before any thread exists, and forks each role on request,
so the roles share those pages copy-on-write and start in milliseconds. ``multiprocessing``'s
forkserver does the same for its workers; this one speaks JSON lines so that the launcher's side
(``engine.hosts.template``) needs neither pickle nor this package.

It warms up in two stages: first what the coordinator needs (no torch), so that the coordinator
is forked and listening while the template goes on to import torch and the other roles' modules;
then it loads the run's data set (read-only arrays every forked role shares, see
``engine.datasets.shared``). Requests are served in the order they came, but a role the template
is not warm for yet waits (the coordinator goes ahead of the data set and the other roles).

Requests on stdin, one JSON object a line::

    {"preload": {"dataset": "mnist", "data_dir": "/data", "train_limit": null,
                 "hash_features": null}}
    {"id": 1, "args": ["worker", ...], "env": {...}, "log": "/path/worker-0.log",
     "append": false}

Replies on stdout: ``{"warm": STAGE, "import_s": S}`` as each stage is done, ``{"ready": PID}``
once warm for every role, ``{"preloaded": NAME, "data_s": S}`` (or ``"preload_error"``),
``{"id": 1, "pid": PID}`` (or ``"error"``) for each fork, ``{"exit": PID, "code": CODE}`` when a
role ends (``CODE`` as ``subprocess.Popen.returncode``: negative for a signal). The template ends
when its stdin closes (the launcher let go) and dies with the launcher. It is started with
OMP_NUM_THREADS=1 in its environment (unless set): nothing may start a thread before a fork.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import logging
import os
import random
import select
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import setproctitle

from engine.roles import lifecycle

# What each stage imports: the coordinator's modules (it never imports torch), then what every
# other role imports before its first message; the rest each role imports itself.
STAGES: tuple[tuple[str, ...], ...] = (
    ("engine.roles.__main__", "engine.roles.coordinator", "engine.transport.schemes"),
    ("torch", "numpy", "engine.roles.worker", "engine.roles.server", "engine.roles.evaluator"),
)
COORDINATOR_STAGE = 0
_REAP_EVERY_S = 0.05
_MAX_LINE = 1 << 20


@dataclass
class _State:
    """The roles forked so far, the requests that wait for a later stage, unread input."""

    children: set[int] = field(default_factory=set)
    waiting: list[dict[str, Any]] = field(default_factory=list)
    pending: bytes = b""
    closed: bool = False  # stdin ended: the launcher let go


def main() -> int:
    lifecycle.die_with_parent()
    # Before any fork, while the environment is the process's own: setproctitle makes room
    # for longer titles by moving it (a role names itself after its own was replaced).
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "engine.roles.template"]))
    state = _State()
    for stage, modules in enumerate(STAGES):
        began = time.perf_counter()
        for module in modules:
            importlib.import_module(module)
        done = {"warm": stage, "import_s": round(time.perf_counter() - began, 4)}
        # Objects alive now live as long as the roles: out of the collector's sight, a
        # collection in a role neither walks nor writes to (and so copies) the pages it shares.
        gc.collect()
        gc.freeze()
        _reply(done)
        _read(state, block_s=0.0)
        if state.closed:  # the launcher let go before it was warm: nothing more to fork
            break
        _serve_waiting(state, stage)
    else:
        _reply({"ready": os.getpid()})
    while not state.closed:
        _read(state, block_s=_REAP_EVERY_S)
        _serve_waiting(state, len(STAGES) - 1)
        _reap(state.children)
    while state.children:  # the launcher let go: the roles it started end on their own or by it
        _reap(state.children, block=True)
    return 0


def _preload(what: dict[str, Any]) -> None:
    """The run's data set, loaded for every role forked from now on, and said what it took; a
    data set that cannot be loaded here is each role's to report (in its log, as without the
    template)."""
    from engine.datasets.loader import preload

    began = time.perf_counter()
    try:
        data_dir = what["data_dir"]
        kept = preload(what["dataset"], None if data_dir is None else Path(data_dir),
                       what["train_limit"], what["hash_features"])
    except Exception as exc:  # said, and left to the roles to meet again
        _reply({"preload_error": f"{type(exc).__name__}: {exc}"[:500]})
        return
    gc.freeze()  # the data set's objects too: shared, never walked by a role's collector
    _reply({"preloaded": what["dataset"] if kept else None,
            "data_s": round(time.perf_counter() - began, 4)})


def _read(state: _State, block_s: float) -> None:
    ready, _, _ = select.select([0], [], [], block_s)
    if not ready:
        return
    chunk = os.read(0, 65536)
    if not chunk:
        state.closed = True
        return
    state.pending += chunk
    while b"\n" in state.pending:
        line, state.pending = state.pending.split(b"\n", 1)
        request = _request(line)
        if request is not None:
            state.waiting.append(request)
    if len(state.pending) > _MAX_LINE:
        _reply({"id": None, "error": "a request longer than the template reads"})
        state.pending = b""


def _serve_waiting(state: _State, stage: int) -> None:
    """Fork every waiting role the template is warm for by ``stage``, in the order asked."""
    later = []
    for request in state.waiting:
        if _stage_of(request) > stage:
            later.append(request)
        elif "preload" in request:
            _preload(request["preload"])
        else:
            _serve(request, state.children)
    state.waiting = later


def _stage_of(request: dict[str, Any]) -> int:
    if request.get("args", [])[:1] == ["coordinator"]:
        return COORDINATOR_STAGE
    return len(STAGES) - 1


def _request(line: bytes) -> dict[str, Any] | None:
    try:
        request = json.loads(line)
        if "preload" in request:
            what = dict(request["preload"])
            limit, space = what.get("train_limit"), what.get("hash_features")
            return {"preload": {"dataset": str(what["dataset"]),
                                "data_dir": None if what.get("data_dir") is None
                                else str(what["data_dir"]),
                                "train_limit": None if limit is None else int(limit),
                                "hash_features": None if space is None else int(space)}}
        return {"id": request["id"], "args": list(map(str, request["args"])),
                "env": {str(k): str(v) for k, v in dict(request["env"]).items()},
                "log": str(request["log"]), "append": bool(request["append"])}
    except (ValueError, KeyError, TypeError) as exc:
        _reply({"id": None, "error": f"a request the template cannot read: {exc}"})
        return None


def _serve(request: dict[str, Any], children: set[int]) -> None:
    try:
        pid = _fork(request["args"], request["env"], request["log"], request["append"])
    except OSError as exc:
        _reply({"id": request["id"], "error": f"cannot fork: {exc}"})
        return
    children.add(pid)
    _reply({"id": request["id"], "pid": pid})


def _fork(args: list[str], env: dict[str, str], log: str, append: bool) -> int:
    # Opened before the fork: a log that cannot be written is the launcher's error, at once.
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(log, flags, 0o644)
    sys.stdout.flush()
    template = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_role(fd, args, env, template)
    os.close(fd)
    return pid


def _become_role(log_fd: int, args: list[str], env: dict[str, str],
                 template: int) -> NoReturn:
    code = 1
    try:
        lifecycle.mark_forked()
        # First: a fork does not keep the template's death signal, and a template killed before
        # the role asks for its own would leave it running, an orphan.
        lifecycle.die_with_parent(parent=template)
        os.setsid()  # its own session, as the launcher starts a role: Ctrl-C reaches it alone
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        # Named as a fresh role would be: in ps, and where psctl proves which process a
        # recorded pid still is (engine.stopping reads the command line).
        setproctitle.setproctitle(" ".join([sys.executable, "-m", "engine.roles", *args]))
        os.environ.clear()
        os.environ.update(env)
        # What a fresh ``python -m engine.roles ...`` has: a user's model may read it.
        sys.argv = [str(Path(__file__).with_name("__main__.py")), *args]
        sys.stdin = open(os.devnull)  # noqa: SIM115 -- the process's own, for its life
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", 0), write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", 0), write_through=True)
        _fresh_random_states()
        from engine.roles.__main__ import main as role_main

        code = role_main(args)
    except SystemExit as exc:  # as the interpreter ends a fresh process on sys.exit(...)
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # said in its log; the role's exit code says it
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        # Never back into the template's loop, nor its exit handlers.
        os._exit(code)


def _fresh_random_states() -> None:
    """Seeded from the system, as in a fresh process: forked roles would otherwise share the
    template's Python and numpy random sequences (torch's default generator starts from the
    same fixed seed in every process anyway, and the roles seed theirs from the run's seed)."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _reap(children: set[int], *, block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if block:
            return


def _reply(message: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):  # the launcher is gone: its roles die with it
        os._exit(0)


def _main() -> NoReturn:
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    _main()
