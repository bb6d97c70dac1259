"""The warm template: ``python -m engine.roles.template``, one per local launch.

A fresh role process spends 1-2 CPU-seconds importing torch, numpy and psctl before its first
message (about 2 s of a worker's 0.5 s digits epoch, and most of a short test's time on two
cores). The template imports them once, before any thread exists, and forks each role on request,
so the roles share those pages copy-on-write and start in milliseconds. ``multiprocessing``'s
forkserver does the same for its workers; this one speaks JSON lines so that the launcher's side
(``engine.hosts.template``) needs neither pickle nor this package.

Requests on stdin, one JSON object a line::

    {"id": 1, "args": ["worker", ...], "env": {...}, "log": "/path/worker-0.log",
     "append": false}

Replies on stdout: ``{"ready": PID}`` once warm, ``{"id": 1, "pid": PID}`` (or ``"error"``)
for each request, ``{"exit": PID, "code": CODE}`` when a role ends (``CODE`` as
``subprocess.Popen.returncode``: negative for a signal). The template ends when its stdin closes
(the launcher let go) and dies with the launcher.
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
import traceback
from typing import Any, NoReturn

import setproctitle

from engine.roles import lifecycle

# What every role imports before its first message; the rest each role imports itself.
WARM_MODULES = ("torch", "numpy", "engine.roles.worker", "engine.roles.server",
                "engine.roles.evaluator", "engine.roles.coordinator",
                "engine.transport.schemes", "engine.roles.__main__")
_REAP_EVERY_S = 0.05
_MAX_LINE = 1 << 20


def main() -> int:
    lifecycle.die_with_parent()
    # Before any fork, while the environment is the process's own: setproctitle makes room
    # for longer titles by moving it (a role names itself after its own was replaced).
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "engine.roles.template"]))
    for module in WARM_MODULES:
        importlib.import_module(module)
    # Objects alive now live as long as the roles: out of the collector's sight, a collection
    # in a role neither walks nor writes to (and so copies) the pages it shares.
    gc.collect()
    gc.freeze()
    _reply({"ready": os.getpid()})
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], _REAP_EVERY_S)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                _serve(line, children)
            if len(pending) > _MAX_LINE:
                return 2
        _reap(children)
    while children:  # the launcher let go: the roles it started end on their own or by it
        _reap(children, block=True)
    return 0


def _serve(line: bytes, children: set[int]) -> None:
    try:
        request = json.loads(line)
        ident = request["id"]
        args, env = list(map(str, request["args"])), dict(request["env"])
        log, append = str(request["log"]), bool(request["append"])
    except (ValueError, KeyError, TypeError) as exc:
        _reply({"id": None, "error": f"a request the template cannot read: {exc}"})
        return
    try:
        pid = _fork(args, env, log, append)
    except OSError as exc:
        _reply({"id": ident, "error": f"cannot fork: {exc}"})
        return
    children.add(pid)
    _reply({"id": ident, "pid": pid})


def _fork(args: list[str], env: dict[str, str], log: str, append: bool) -> int:
    # Opened before the fork: a log that cannot be written is the launcher's error, at once.
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(log, flags, 0o644)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _become_role(fd, args, env)
    os.close(fd)
    return pid


def _become_role(log_fd: int, args: list[str], env: dict[str, str]) -> NoReturn:
    code = 1
    try:
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
