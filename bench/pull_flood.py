"""Waiting-pull floods and slow readers against a live run: the workers' rate and the server's RSS.

A real run (digits, BSP, 2 workers, 1 shard server) trains on each transport (tcp, websocket)
while this process attacks its shard server with worker 0's own credential:

* *flood*: N connections each send pulls for clocks the run never reaches, as fast as the server
  takes them, reading (and counting) the refusals, reconnecting when closed;
* *slow readers*: N connections each send full-shard pulls answerable at once and never read.

Each attack window (``ATTACK_S``) follows a baseline window of the same length with no attack,
and its rate is divided by that baseline's (iterations of both workers per second, from the
run's ``iterations`` table). The server's RSS is sampled every 0.1 s; growth is the peak during
the attacks over the median of the first baseline, and "after" is the median over the window
that follows an attack (0.5 s after it, its connections gone) over that same baseline: whether
the server gave the memory back. Passes alternate the order of the transports:
the machine is shared and noisy. Goals (issue 37): rate >= 0.5x, RSS growth < 64 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402
from engine.config import RunConfig  # noqa: E402
from engine.errors import PsctlError  # noqa: E402
from engine.keys import KeyRange  # noqa: E402
from engine.launcher import Launcher  # noqa: E402
from engine.roles.coordinator import model_layout  # noqa: E402
from engine.transport.admission import credential  # noqa: E402
from engine.transport.base import Connection  # noqa: E402
from engine.transport.schemes import SchemeTransport  # noqa: E402
from engine.wire.protocol import ANY_CLOCK, Frame, MsgType, Role, encode  # noqa: E402

TITLE = "Waiting-pull floods and slow readers (`bench/pull_flood.py`)"
MIB = 2**20
FAR_CLOCK = 10**9  # a BSP clock no run of this benchmark reaches
MIN_RATIO, MAX_GROWTH_MB = 0.5, 64.0
SLOW_PULLS = 400  # per slow connection: replies it never reads
ATTACKS = ("flood", "slow readers")


def _config(transport: str, seconds: float) -> RunConfig:
    return RunConfig.model_validate({
        "data": {"dataset": "digits"},
        "cluster": {"workers": 2, "servers": 1, "transport": transport},
        "train": {"epochs": 100_000},
        "sync": {"model": "bsp"},
        "stop": {"max_seconds": seconds},
    })


def _query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        return connection.execute(sql, args).fetchall()


def _rate(db: Path, run_id: str, window: tuple[float, float]) -> float:
    start, end = window
    count = _query(db, "SELECT count(*) FROM iterations WHERE run_id = ? AND ended_at >= ? "
                       "AND ended_at < ?", run_id, start, end)[0][0]
    return float(count) / (end - start)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _server_address(db: Path) -> str | None:
    with contextlib.suppress(sqlite3.OperationalError):
        for (detail,) in _query(db, "SELECT detail FROM events WHERE kind = 'server_listening'"):
            return str(json.loads(detail)["address"])
    return None


def _wait(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError):
            value = predicate()
            if value:
                return value
        time.sleep(0.2)
    raise TimeoutError("the run did not start training in time")


class Sampler(threading.Thread):
    """The server's RSS every 0.1 s, with wall-clock times (bounded by ``until``)."""

    def __init__(self, pid: int, until: float) -> None:
        super().__init__(name="rss", daemon=True)
        self.pid, self.until = pid, until
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set() and time.time() < self.until:
            try:
                self.samples.append((time.time(), _rss(self.pid)))
            except OSError:
                return
            self.stopped.wait(0.1)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for at, rss in self.samples if start <= at < end]


class Attack:
    """One attack of ``connections`` connections for ``seconds``, on a loop of its own."""

    def __init__(self, kind: str, address: str, token: str, run: bytes, shard: KeyRange) -> None:
        self.kind, self.address, self.token, self.run, self.shard = kind, address, token, run, shard
        self.transport = SchemeTransport(max_frame_bytes=64 * MIB)
        self.seen = {"sent": 0, "errors": 0, "answers": 0, "closed": 0}

    def pull(self, request_id: int, clock: int) -> bytearray:
        return encode(Frame(MsgType.PULL, request_id, self.shard, run=self.run, role=Role.WORKER,
                            rank=0, clock=clock))

    async def run_for(self, connections: int, seconds: float) -> dict[str, int]:
        until = time.monotonic() + seconds
        await asyncio.gather(*(self._one(n, until) for n in range(connections)))
        return self.seen

    async def _one(self, n: int, until: float) -> None:
        while time.monotonic() < until - 0.2:
            try:
                connection = await self.transport.connect(self.address, token=self.token,
                                                          timeout=5)
            except PsctlError:
                await asyncio.sleep(0.2)
                continue
            try:
                if self.kind == "flood":
                    await self._flood(connection, n, until)
                else:
                    await self._slow(connection, n, until)
            except (PsctlError, TimeoutError):  # closed by the server, or its sends blocked
                self.seen["closed"] += 1
            finally:
                await _abort(connection)

    async def _flood(self, connection: Connection, n: int, until: float) -> None:
        reader = asyncio.ensure_future(self._read(connection))
        try:
            request = n * 10**7
            while time.monotonic() < until and not reader.done():
                for _ in range(64):
                    request += 1
                    await connection.send(self.pull(request, FAR_CLOCK + request))
                    self.seen["sent"] += 1
                await asyncio.sleep(0.01)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, PsctlError):
                await reader

    async def _read(self, connection: Connection) -> None:
        while True:
            message = await connection.recv()
            is_error = not isinstance(message, str) and message[3] == MsgType.ERROR
            self.seen["errors" if is_error else "answers"] += 1

    async def _slow(self, connection: Connection, n: int, until: float) -> None:
        for request in range(SLOW_PULLS):  # never read: the replies back up at the server
            await asyncio.wait_for(connection.send(self.pull(n * 10**7 + request, ANY_CLOCK)),
                                   max(until - time.monotonic(), 0.01))
            self.seen["sent"] += 1
        await asyncio.sleep(max(until - time.monotonic(), 0.0))


async def _abort(connection: Connection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(connection.close(), 1.0)


def measure_run(transport: str, counts: list[int], window_s: float, db: Path) -> dict[str, Any]:
    """One run on ``transport``: a baseline and an attack window per (attack, count)."""
    seconds = 30 + 2 * window_s * len(counts) * len(ATTACKS) + window_s
    load_at_start = os.getloadavg()[0]
    launcher = Launcher(_config(transport, seconds), db=db)
    launcher.start()
    try:
        run_id = launcher.run_id
        _wait(lambda: _query(db, "SELECT count(*) FROM iterations WHERE run_id = ?",
                             run_id)[0][0] >= 50, 60)
        address = _wait(lambda: _server_address(db), 10)
        pid = next(c.process.pid for c in launcher.children if c.role == "server")
        sampler = Sampler(pid, time.time() + seconds)
        sampler.start()
        token = credential(launcher.join_token, "worker", 0)
        shard = KeyRange(0, model_layout(launcher.config).num_keys)
        run = bytes.fromhex(run_id)[:16]
        windows: list[dict[str, Any]] = []
        first_base: tuple[float, float] | None = None
        for kind in ATTACKS:
            for count in counts:
                start = time.time()
                time.sleep(window_s)
                base = (start, time.time())
                first_base = first_base or base
                attack = Attack(kind, address, token, run, shard)
                start = time.time()
                seen = asyncio.run(attack.run_for(count, window_s))
                during = (start, time.time())
                time.sleep(0.5)  # let the recorder commit the window's rows
                windows.append({
                    "attack": kind, "connections": count, "ended_at": during[1],
                    "base_rate": round(_rate(db, run_id, base), 2),
                    "attack_rate": round(_rate(db, run_id, during), 2),
                    "rss_peak_mb": round(max(sampler.between(*during), default=0) / MIB, 1),
                    "seen": dict(seen)})
        time.sleep(window_s)
        sampler.stopped.set()
        sampler.join(5)
        assert first_base is not None
        before = statistics.median(sampler.between(*first_base)) / MIB
        after = _rss(pid) / MIB
        for row in windows:
            row["ratio"] = round(row["attack_rate"] / row["base_rate"], 3) if row["base_rate"] \
                else None
            row["rss_growth_mb"] = round(row["rss_peak_mb"] - before, 1)
            settled = sampler.between(row["ended_at"] + 0.5, row["ended_at"] + 0.5 + window_s)
            row["rss_after_growth_mb"] = round(statistics.median(settled) / MIB - before, 1) \
                if settled else None
        return {"transport": transport, "rss_before_mb": round(before, 1),
                "rss_after_mb": round(after, 1), "windows": windows,
                "loadavg_1min": [round(load_at_start, 2), round(os.getloadavg()[0], 2)]}
    finally:
        launcher.stop_all()


def summarise(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (transport, attack, connections): the median rate ratio, the largest RSS growth and
    the largest RSS left after the attack over passes, and whether the goals were met."""
    cells: dict[str, dict[str, list[float]]] = {}
    for run in (r for p in passes for r in p["runs"]):
        for row in run["windows"]:
            key = f"{run['transport']} / {row['attack']} / {row['connections']}"
            cell = cells.setdefault(key, {"ratio": [], "growth": [], "after": []})
            if row["ratio"] is not None:
                cell["ratio"].append(row["ratio"])
            cell["growth"].append(row["rss_growth_mb"])
            if row.get("rss_after_growth_mb") is not None:
                cell["after"].append(row["rss_after_growth_mb"])
    summary = {}
    for key, cell in cells.items():
        ratio = statistics.median(cell["ratio"]) if cell["ratio"] else None
        growth = max(cell["growth"])
        summary[key] = {"rate_ratio": ratio, "rss_growth_mb": growth,
                        "rss_after_mb": max(cell["after"], default=None),
                        "rate_goal_met": ratio is not None and ratio >= MIN_RATIO,
                        "memory_goal_met": growth < MAX_GROWTH_MB}
    return summary


def docs_body(payload: dict[str, Any]) -> str:
    lines = [
        "A real run (digits, BSP, 2 workers, 1 shard server) attacked with worker 0's own "
        "credential: *flood* = N connections sending pulls for clocks the run never reaches; "
        "*slow readers* = N connections sending full-shard pulls and never reading. Rate = "
        "the workers' iterations per second during the attack over a baseline window just "
        "before it (median over passes); RSS growth = the server's peak during the attack "
        "over its resident size before the first attack (largest over passes); RSS after = "
        "the same for the median over the window after the attack, its connections gone "
        "(largest over passes). Goals: rate "
        f">= {MIN_RATIO}x, growth < {MAX_GROWTH_MB:.0f} MB. Passes alternate the order of "
        "the transports; the machine is shared with other work (2 cores), so single windows "
        f"are noisy. {payload['passes_run']} passes of {payload['window_s']:g} s windows"
        f"{_load_note(payload)}.",
        "",
        "| transport | attack | connections | rate (x before) | RSS growth (MB) "
        "| RSS after (MB) | goals |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, cell in payload["summary"].items():
        transport, attack, count = key.split(" / ")
        ratio = "n/a" if cell["rate_ratio"] is None else f"{cell['rate_ratio']:.2f}"
        met = "met" if cell["rate_goal_met"] and cell["memory_goal_met"] else "NOT met"
        after = cell.get("rss_after_mb")
        lines.append(f"| {transport} | {attack} | {count} | {ratio} | "
                     f"{cell['rss_growth_mb']:.1f} | {'n/a' if after is None else f'{after:.1f}'} "
                     f"| {met} |")
    return "\n".join(lines)


def _load_note(payload: dict[str, Any]) -> str:
    loads = [x for p in payload.get("passes", []) for r in p["runs"]
             for x in r.get("loadavg_1min", [])]
    return f"; load average (1 min) {min(loads):.1f}-{max(loads):.1f}" if loads else ""


def main() -> None:
    C.reexec_with_malloc_env()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--window", type=float, default=4.0, help="seconds per window")
    parser.add_argument("--quick", action="store_true",
                        help="1 pass, 2 connections, 2 s windows; docs untouched")
    parser.add_argument("--db", type=Path, default=C.RESULTS / "pull_flood.db")
    args = parser.parse_args()
    counts = [2] if args.quick else [2, 4, 16]
    if args.quick:
        args.passes, args.window = 1, 2.0
    C.RESULTS.mkdir(parents=True, exist_ok=True)
    passes = []
    for index in range(args.passes):
        transports = ["tcp", "websocket"] if index % 2 == 0 else ["websocket", "tcp"]
        runs = []
        for transport in transports:
            print(f"pass {index + 1}: {transport}", flush=True)
            args.db.unlink(missing_ok=True)
            runs.append(measure_run(transport, counts, args.window, args.db))
        passes.append({"runs": runs})
    payload = {"machine": C.machine_info(), "window_s": args.window, "passes_run": args.passes,
               "passes": passes, "summary": summarise(passes)}
    path = C.write_result("pull_flood" + ("-quick" if args.quick else ""), payload)
    print(f"wrote {path}")
    if not args.quick:
        C.update_docs_section(TITLE, docs_body(payload))
    print(json.dumps(payload["summary"], indent=2))


if __name__ == "__main__":
    main()
