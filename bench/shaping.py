"""Link shaping, achieved against set (issue 55): how closely real connections shaped in user
space (``engine.transport.shaping``) take the bandwidth and latency they are set to.

Two processes on loopback, each with its own ``LinkShaper`` of the same link (as a worker and a
shard server with ``--network``), over the TCP and the websocket transport:

- bandwidth: the client sends messages of 1 MB (64 KB at 10 Mbit/s) back to back for about two
  seconds of set time, each acknowledged by a small reply, and waits for the last; achieved =
  bytes / the time from the first send to the last acknowledgement, less one round trip of the
  latency (as achieved below);
- latency: 40 small messages, each answered before the next, on a link of 10 Gbit/s; achieved
  one-way latency = the median round trip / 2.

Each at 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, and 0.1, 1 and 20 ms, alone and with two CPU hogs
(``python -c 'while True: pass'``, ended by PID) beside it, in alternating order. Reproduce:
``python bench/shaping.py`` (about two minutes); ``--quick`` one of each.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common  # noqa: E402
from engine.transport.admission import Admission, credential  # noqa: E402
from engine.transport.base import Connection, Transport  # noqa: E402
from engine.transport.shaping import NetworkModel, parse_network, shaped  # noqa: E402

NAME = "shaping"
SECRET = "bench-shaping"
BANDWIDTHS = ("10mbit", "100mbit", "1gbit")
LATENCIES = ("0.1ms", "1ms", "20ms")
LOAD_LATENCY = "0.1ms"  # of the bandwidth runs: small beside their seconds
FAST = "10gbit"  # of the latency runs: their bytes take no time
SET_SECONDS = 2.0
PINGS = 40
# The round trip a bandwidth run's last acknowledgement adds: its set latency each way, which the
# event loop's millisecond timer steps take as about 1.1 ms (the latency rows below).
ROUND_TRIP_S = 0.0011


def _transport(name: str) -> Transport:
    from engine.transport.tcp import TcpTransport
    from engine.transport.websocket import WebSocketTransport

    return TcpTransport() if name == "tcp" else WebSocketTransport()


def _serve(pipe: Pipe, transport: str, spec: str) -> None:
    """The server process: a shaped listener answering every message with a small one."""
    model = parse_network(spec)

    async def answer(connection: Connection) -> None:
        while True:
            await connection.recv()
            await connection.send(b"ok")

    async def main() -> None:
        def peer(admission: Admission | None) -> NetworkModel | None:
            return model if admission is not None else None

        listener = await shaped(_transport(transport), model, peer).listen(
            "127.0.0.1", 0, answer, token=SECRET)
        pipe.send(listener.address)
        await asyncio.Event().wait()

    asyncio.run(main())


def measure(transport: str, spec: str, kind: str) -> dict[str, float]:
    """One measurement (see the module's doc) of ``spec`` over ``transport``."""
    mine, theirs = multiprocessing.get_context("fork").Pipe()
    server = multiprocessing.get_context("fork").Process(target=_serve,
                                                          args=(theirs, transport, spec))
    server.start()
    try:
        address = mine.recv()
        return asyncio.run(_client(transport, spec, address, kind))
    finally:
        server.kill()
        server.join(5)


async def _client(transport: str, spec: str, address: str, kind: str) -> dict[str, float]:
    model = parse_network(spec)
    client = shaped(_transport(transport), model, lambda admission: model)
    connection = await client.connect(address, token=credential(SECRET, "worker", 0),
                                      timeout=10)
    try:
        if kind == "bandwidth":
            size = 64_000 if model.bytes_per_s < 2e6 else 1_000_000
            count = max(3, round(SET_SECONDS * model.bytes_per_s / size))
            began = time.monotonic()
            acks = asyncio.ensure_future(_acks(connection, count))
            for _ in range(count):
                await connection.send(bytes(size))
            await acks
            took = time.monotonic() - began - 2 * ROUND_TRIP_S
            return {"set": model.bytes_per_s * 8, "achieved": size * count * 8 / took}
        rounds = []
        for _ in range(PINGS):
            began = time.monotonic()
            await connection.send(b"ping")
            await connection.recv()
            rounds.append(time.monotonic() - began)
        return {"set": model.latency_s, "achieved": statistics.median(rounds) / 2}
    finally:
        await connection.close()


async def _acks(connection: Connection, count: int) -> None:
    for _ in range(count):
        await connection.recv()


TITLE = "Link shaping, achieved against set (bench/shaping.py; issue 55)"


def write_docs(result: dict[str, Any]) -> None:
    """docs/benchmarks.md's section: achieved / set per link, transport and load."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for row in result["rows"]:
        rows.setdefault((row["kind"], row["spec"]), {})[f"{row['load']} {row['transport']}"] = \
            row["ratio"]
    lines = ["| what | set | alone, tcp | alone, websocket | two hogs, tcp | two hogs, websocket |",
             "|---|---|---|---|---|---|"]
    for (kind, spec), got in rows.items():
        shown = [f"{got.get(f'{load} {t}', float('nan')):.3f}" for load in ("alone", "two hogs")
                 for t in ("tcp", "websocket")]
        lines.append(f"| {kind} | {spec} | " + " | ".join(shown) + " |")
    machine = result["machine"]
    how = (__doc__ or "").split("\n\n")[1].rstrip(":")
    intro = (f"Command: `python bench/shaping.py`. {how}." +
             f" Load average {machine['loadavg_at_start'][0]:.2f} at the start. Achieved / set "
             "(1.000 is exact; for latency, the one-way time measured over the time set):")
    verdict = ("Bandwidth is met within 1 % from 10 Mbit/s to 1 Gbit/s, alone and beside two "
               "CPU hogs. Latency is met within 2 % at 20 ms, but the event loop's timers have "
               "millisecond steps (epoll): 1 ms comes out 13-15 % long and anything under a "
               "millisecond as about 1.1 ms.")
    _common.update_docs_section(TITLE, "\n\n".join([
        _common.paragraph(intro), "\n".join(lines), _common.paragraph(verdict)]))


def hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--redraw", action="store_true",
                        help="rewrite the docs section from bench/results/shaping.json")
    args = parser.parse_args(argv)
    if args.redraw:
        import json

        write_docs(json.loads((_common.RESULTS / f"{NAME}.json").read_text()))
        return 0
    specs = [("bandwidth", f"{b}:{LOAD_LATENCY}") for b in BANDWIDTHS] + [
        ("latency", f"{FAST}:{lat}") for lat in LATENCIES]
    if args.quick:
        specs = [specs[1], specs[4]]
    rows: list[dict[str, Any]] = []
    for load in ("alone", "two hogs"):
        started = hogs(2 if load == "two hogs" else 0)
        try:
            order = specs if load == "alone" else list(reversed(specs))
            for kind, spec in order:
                for transport in ("tcp", "websocket"):
                    got = measure(transport, spec, kind)
                    rows.append({"load": load, "kind": kind, "spec": spec,
                                 "transport": transport, **got,
                                 "ratio": got["achieved"] / got["set"]})
                    print(f"{load:8} {kind:9} {spec:14} {transport:9} achieved/set "
                          f"{rows[-1]['ratio']:.3f}", flush=True)
        finally:
            for hog in started:
                hog.kill()
                hog.wait()
    if not args.quick:
        result = {"machine": _common.machine_info(), "rows": rows}
        _common.write_result(NAME, result)
        write_docs(result)
    return 0


if __name__ == "__main__":
    _common.reexec_with_malloc_env()  # the roles' allocator settings, as a run's processes have
    sys.exit(main())
