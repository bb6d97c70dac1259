"""Shared helpers for the benchmarks in ``bench/``: processes, baselines, results, docs rows.

Every benchmark runs real processes over real websockets on loopback. The servers (psctl shard
servers and the raw websocket echo servers used as baselines) run in their own processes,
started with ``python -m bench._common <role> ...`` so that client and server never share a GIL.
Every process of a benchmark -- the servers and the benchmark (client) process itself -- runs
with the glibc malloc settings that ``engine.launcher`` gives the processes of a real run
(``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456``): ``reexec_with_malloc_env``
restarts the benchmark script with them if they are missing.

A server prints ``READY <address>`` on stdout once it listens and exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}
TOKEN = "bench-token"
RUN_ID = bytes(range(16))
MAX_FRAME_BYTES = 64 * 2**20
HIDDEN = (512, 512, 512)
INPUT_DIM, CLASSES = 784, 10
REPLY_SIZE_BYTES = 8  # an echo request starts with the size of the reply it wants (u64 LE)


# -- environment --------------------------------------------------------------------------------


_NO_MALLOC_FLAG = "--no-malloc-env"


def reexec_with_malloc_env() -> None:
    """Restart this script with the malloc settings of a psctl run if they are not set.

    With ``--no-malloc-env`` on the command line, restart it *without* them instead (to measure
    what they are worth); every server it starts then runs without them too.
    """
    if _NO_MALLOC_FLAG in sys.argv:
        if not any(k in os.environ for k in MALLOC_ENV):
            return
    elif all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], child_env())


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    if _NO_MALLOC_FLAG in sys.argv:
        for key in MALLOC_ENV:
            env.pop(key, None)
    else:
        env.update(MALLOC_ENV)
    # As engine.launcher gives every role (train.torch_threads, default 1): a server's BLAS
    # on one thread; OpenBLAS's idle threads otherwise spin, taking the workers' CPU.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def machine_info() -> dict[str, Any]:
    import numpy
    import torch
    import websockets

    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "websockets": getattr(websockets, "__version__", ""),  # not re-exported for mypy
        "torch_threads": torch.get_num_threads(),
        "malloc_env": {k: os.environ.get(k) for k in MALLOC_ENV},
        "loadavg_at_start": list(os.getloadavg()),
    }


# -- frame sizes --------------------------------------------------------------------------------


def frame_sizes(num_keys: int) -> dict[str, int]:
    """Bytes of each psctl frame for one request covering ``num_keys`` float32 keys."""
    from engine.wire.protocol import HEADER_BYTES

    values = HEADER_BYTES + 8 + 4 * num_keys  # header, one shape dimension, payload
    return {"push": values, "ack": HEADER_BYTES, "pull": HEADER_BYTES, "values": values}


def num_model_keys() -> int:
    from engine.models.spec import MLPSpec

    return MLPSpec(INPUT_DIM, HIDDEN, CLASSES).num_keys


# -- server processes ---------------------------------------------------------------------------


class ServerProcess:
    """A server in its own process; ``address`` once it is up. Stop it with ``stop``."""

    def __init__(self, role: str, args: Sequence[str] = ()) -> None:
        self.role = role
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench._common", role, *args],
            cwd=REPO,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"{role} server did not start (said {line!r})")
        self.address = line.split(" ", 1)[1]
        self._final: dict[str, Any] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> dict[str, Any]:
        """Close stdin (the server's signal to exit); return what it printed last (JSON)."""
        final: dict[str, Any] | None = getattr(self, "_final", None)
        if final is not None:
            return final
        try:  # communicate() closes stdin, then reads stdout until the server exits
            out, _ = self.process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        lines = [x for x in out.decode().splitlines() if x.startswith("{")]
        self._final = json.loads(lines[-1]) if lines else {}
        return self._final


@contextlib.contextmanager
def servers(specs: Sequence[tuple[str, Sequence[str]]]) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for role, args in specs:
            started.append(ServerProcess(role, args))
        yield started
    finally:
        for server in started:
            server.stop()


def proc_counters(pid: int) -> tuple[int, float]:
    """(minor page faults, CPU seconds user+system) of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[7]), (int(fields[11]) + int(fields[12])) / tick


def thread_cpu_s(tid: int) -> float:
    """CPU seconds (user+system) of one thread of this process, from /proc."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_counters() -> tuple[int, float]:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_utime + usage.ru_stime


class Counters:
    """Faults and CPU time of this process and some server processes over a pass."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self._start = self._read()

    def _read(self) -> list[tuple[int, float]]:
        return [self_counters(), *(proc_counters(pid) for pid in self.pids)]

    def per(self, count: int) -> dict[str, float]:
        """Per-operation faults and CPU ms since construction, client then servers summed."""
        end = self._read()
        deltas = [(e[0] - s[0], e[1] - s[1]) for s, e in zip(self._start, end, strict=True)]
        client, servers_ = deltas[0], deltas[1:]
        return {
            "client_faults": client[0] / count,
            "client_cpu_ms": 1e3 * client[1] / count,
            "server_faults": sum(d[0] for d in servers_) / count,
            "server_cpu_ms": 1e3 * sum(d[1] for d in servers_) / count,
        }


# -- raw websocket baseline ---------------------------------------------------------------------


def echo_request(size: int, reply: int) -> bytes:
    """A preallocated request of ``size`` bytes asking the echo server for ``reply`` bytes."""
    data = bytearray(size)
    data[:REPLY_SIZE_BYTES] = reply.to_bytes(REPLY_SIZE_BYTES, "little")
    return bytes(data)


async def echo_connect(address: str) -> Any:
    from websockets.asyncio.client import connect

    return await connect(address, compression=None, max_size=MAX_FRAME_BYTES, ping_interval=None)


# -- statistics, results, docs ------------------------------------------------------------------


def query_db(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of a run database, read-only (the run may still be writing it)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        return connection.execute(sql, args).fetchall()


def run_events(db: Path, run_id: str, kind: str) -> list[tuple[float, dict[str, Any]]]:
    """(when, detail) of a run's events of one kind, oldest first."""
    return [(at, json.loads(detail)) for at, detail in query_db(
        db, "SELECT at, detail FROM events WHERE run_id = ? AND kind = ? ORDER BY at",
        run_id, kind)]


def training_outcome(db: Path, run_id: str) -> dict[str, Any]:
    """When a run's training started (unix s), how long it trained until its last iteration,
    its iterations and its final test accuracy."""
    started = run_events(db, run_id, "training_started")
    first = started[0][0] if started else None
    ended, count = query_db(db, "SELECT max(ended_at), count(*) FROM iterations WHERE "
                                "run_id = ?", run_id)[0]
    final = query_db(db, "SELECT accuracy FROM evaluations WHERE run_id = ? ORDER BY at DESC "
                         "LIMIT 1", run_id)
    return {"training_started": first,
            "training_s": (ended - first) if first and ended else None,
            "iterations": count, "final_accuracy": final[0][0] if final else None}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    return [a / b for a, b in zip(numerator, denominator, strict=True)]


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


_DOCS_HEADER = """# Benchmarks

Each benchmark is a script in `bench/` that writes its raw samples, medians and machine
information to `bench/results/<name>.json` and prints the rows below. Every figure is a ratio
against a baseline measured in the same script, in alternating passes (the machine is noisy:
absolute numbers move by tens of percent from run to run, ratios much less); medians are given.
"""


def add_pass_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """The options every multi-pass benchmark takes: pass order, appending to the recorded
    passes in bench/results/<name>.json, the quick smoke version, and the database."""
    parser.add_argument("--order", choices=("forward", "reverse"), default="forward")
    parser.add_argument("--append", action="store_true",
                        help=f"keep the earlier passes in bench/results/{name}.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--db", type=Path, default=None)


def add_config_arguments(parser: argparse.ArgumentParser, name: str, *, budget_s: float,
                         redraws: str = "the docs section") -> None:
    """The options of a bench that trains named configurations for a time budget each."""
    parser.add_argument("--budget-s", type=float, default=budget_s,
                        help="seconds each configuration trains")
    add_pass_arguments(parser, name)
    parser.add_argument("--only", action="append", default=None,
                        help="run only this configuration (repeatable; a smoke test)")
    parser.add_argument("--redraw", action="store_true",
                        help=f"rewrite {redraws} from bench/results/{name}.json (runs nothing)")


def earlier_passes(name: str) -> list[dict[str, Any]]:
    """The passes recorded in bench/results/<name>.json, for ``--append``."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return []
    return list(json.loads(path.read_text()).get("passes", []))


def update_docs_section(title: str, body: str) -> None:
    """Replace (or append) the ``## title`` section of docs/benchmarks.md, keeping the others."""
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    text = DOCS.read_text() if DOCS.exists() else _DOCS_HEADER
    heading = f"## {title}"
    section = f"{heading}\n\n{body.strip()}\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        tail = "".join(lines[end:])
        text = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    DOCS.write_text(text)


def paragraph(text: str) -> str:
    """A Markdown paragraph wrapped at 100 columns, from an indented multi-line string."""
    return textwrap.fill(
        " ".join(text.split()), width=100, break_long_words=False, break_on_hyphens=False
    )


def wrap_lines(lines: Sequence[str]) -> list[str]:
    """Wrap every line that is not part of a table."""
    return [line if line.startswith("|") or not line else paragraph(line) for line in lines]


def pass_tables(passes: Sequence[dict[str, Any]],
                tables: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """Each pass under a heading with its order and load, then what ``tables`` makes of it."""
    body: list[str] = []
    for number, one in enumerate(passes, start=1):
        load = one["machine"]["loadavg_at_start"][0]
        body += [f"Pass {number} ({one['order']} order, load average {load:.2f} at its start):",
                 "", *tables(one), ""]
    return body


def machine_note(info: dict[str, Any]) -> str:
    return paragraph(
        f"Machine: {info['cpu_count']} vCPU {info['cpu_model']}, Python {info['python']}, "
        f"torch {info['torch']}, numpy {info['numpy']}, websockets {info['websockets']}; "
        f"load average {info['loadavg_at_start'][0]:.2f} at the start (the machine is shared "
        "with other runs; absolute figures move by tens of percent between runs)."
    )


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}x"


# -- server roles (python -m bench._common ROLE ...) --------------------------------------------


def _wait_for_stdin_eof(loop: asyncio.AbstractEventLoop, done: asyncio.Event) -> None:
    def read() -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdin.buffer.read()
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=read, daemon=True).start()


async def _psctl_server(args: argparse.Namespace) -> dict[str, Any]:
    from engine.config import OptimizerConfig
    from engine.consistency.registry import make_controller
    from engine.keys import KeyRange
    from engine.models.spec import MLPSpec
    from engine.server.optimizers import make_optimizer
    from engine.server.service import ShardServer
    from engine.server.shard import ShardState
    from engine.transport.schemes import SchemeTransport

    keys = KeyRange(args.start, args.end)
    # the default optimizer is SGD, lr 0.1, momentum 0.9; "none" (a diagnostic) applies nothing
    optimizer = (
        _NoOptimizer() if args.optimizer == "none" else make_optimizer(OptimizerConfig(), len(keys))
    )
    # The clock ranges a real run's shard has: the MLP's layers cut at the shard's bounds.
    ranges = MLPSpec(INPUT_DIM, HIDDEN, CLASSES).layout().clock_ranges(keys)
    state = ShardState(
        keys, make_controller(args.sync, workers=args.workers, ranges=len(ranges)), optimizer,
        workers=args.workers, ranges=ranges,
    )
    server = ShardServer(state, run=RUN_ID, rank=args.rank, max_frame_bytes=MAX_FRAME_BYTES)
    transport = SchemeTransport(max_frame_bytes=MAX_FRAME_BYTES, listens=args.transport)
    address = await server.start(transport, "127.0.0.1", 0, token=TOKEN)
    done = asyncio.Event()
    _wait_for_stdin_eof(asyncio.get_running_loop(), done)
    print(f"READY {address}", flush=True)
    await done.wait()
    await server.close()
    return {"version": state.version, "pushes": state.pushes, "frames_in": server.stats.frames_in}


class _NoOptimizer:
    """Diagnostic only: accepts every update and changes nothing (what SGD costs, by difference)."""

    def apply(self, params: Any, update: Any, scale: float = 1.0) -> None:
        pass

    def slots(self) -> tuple[Any, ...]:
        return ()

    def step_bound(self, params: Any, update: Any, scale: float) -> float | None:
        return 0.0  # nothing changes: no copy, no check, as free as an update can be


async def _echo_server(args: argparse.Namespace) -> dict[str, Any]:
    from websockets.asyncio.server import serve

    replies: dict[int, bytes] = {}
    served = 0

    async def handler(socket: Any) -> None:
        nonlocal served
        async for message in socket:
            size = int.from_bytes(message[:REPLY_SIZE_BYTES], "little")
            reply = replies.get(size)
            if reply is None:  # preallocated once per size, reused for every reply
                reply = replies[size] = bytes(size)
            await socket.send(reply)
            served += 1

    server = await serve(
        handler, "127.0.0.1", 0, compression=None, max_size=MAX_FRAME_BYTES, ping_interval=None
    )
    done = asyncio.Event()
    _wait_for_stdin_eof(asyncio.get_running_loop(), done)
    port = server.sockets[0].getsockname()[1]
    print(f"READY ws://127.0.0.1:{port}", flush=True)
    await done.wait()
    server.close()
    await server.wait_closed()
    return {"served": served}


def _serve_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._common")
    sub = parser.add_subparsers(dest="role", required=True)
    psctl = sub.add_parser("psctl-server", help="one psctl ShardServer")
    psctl.add_argument("--start", type=int, required=True)
    psctl.add_argument("--end", type=int, required=True)
    psctl.add_argument("--rank", type=int, default=0)
    psctl.add_argument("--sync", choices=("asp", "bsp"), default="asp")
    psctl.add_argument("--workers", type=int, default=1)
    psctl.add_argument("--optimizer", choices=("sgd", "none"), default="sgd")
    psctl.add_argument("--transport", choices=("websocket", "tcp"), default="websocket")
    psctl.add_argument("--profile", help="write a cProfile of the server to this path")
    echo = sub.add_parser("echo-server", help="raw websocket server, preallocated replies")
    echo.add_argument("--profile", help="write a cProfile of the server to this path")
    args = parser.parse_args(argv)
    run = _psctl_server if args.role == "psctl-server" else _echo_server
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        result = profiler.runcall(asyncio.run, run(args))
        profiler.dump_stats(args.profile)
    else:
        result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)


def monotonic_deadline(seconds: float) -> float:
    return time.perf_counter() + seconds


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
