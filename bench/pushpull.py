"""Push+pull round trips per second of the full MNIST MLP: psctl versus raw websockets.

psctl: a ``ParameterClient`` (the worker's client, I/O on its background ``LoopThread``) talks to
``ShardServer`` processes (ASP controller, so pulls never wait; the default SGD optimizer, lr 0.1
and momentum 0.9, applies every push). One round trip pushes a gradient for all 932,362 keys
(3.73 MB) and pulls all the values back.

Baseline: a plain ``websockets`` client (asyncio on the main thread) and echo-server processes
that reply to each frame with a preallocated ``bytes`` of the requested size; compression off,
``max_size`` 64 MiB; exactly psctl's frame sizes. Same process layout: one client process, one
server process per shard.

Variants, alternated pass by pass (order reversed every other round) and reported as medians:

* ``pipelined``: psctl issues the push and the pull together and waits for both (two frames each
  way); raw sends one push-sized frame and receives one values-sized frame.
* ``sequential``: psctl pushes, waits for the ack, then pulls and waits (what the plain worker
  loop does); raw does the same two exchanges (push-sized -> ack-sized, pull-sized ->
  values-sized), one after the other.
* ``2 shards``: pipelined against two servers, the client splitting the keys; raw sends both
  halves to two echo servers, then receives both replies.

Run: ``python bench/pushpull.py`` (about 100 s) or ``--quick`` (a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C

NAME = "pushpull"


@dataclass
class PsctlSide:
    client: Any
    keys: Any
    grad: Any
    out: Any
    clock: int = 0
    versions: dict[int, int] = field(default_factory=dict)

    def pipelined(self) -> None:
        push = self.client.push(self.keys, self.grad, clock=self.clock,
                                base_versions=self.versions)
        pull = self.client.pull(self.keys, self.out, clock=self.clock + 1)
        self.client.wait(push)
        self.versions = self.client.wait(pull).versions
        self.clock += 1

    def sequential(self) -> None:
        self.client.wait(self.client.push(self.keys, self.grad, clock=self.clock,
                                          base_versions=self.versions))
        self.clock += 1
        self.versions = self.client.wait(self.client.pull(self.keys, self.out,
                                                          clock=self.clock)).versions


class RawSide:
    """Plain websockets client on an asyncio loop run by the main thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, addresses: list[str],
                 exchanges: list[list[tuple[bytes, int]]]) -> None:
        # exchanges[i] = the (request, reply size) pairs sent to server i, one after the other
        self.loop = loop
        self.sockets = [loop.run_until_complete(C.echo_connect(a)) for a in addresses]
        self.exchanges = exchanges

    async def _run(self, deadline: float) -> tuple[int, float]:
        sockets, count, t0 = self.sockets, 0, time.perf_counter()
        steps = len(self.exchanges[0])
        while True:
            for step in range(steps):
                for sock, plan in zip(sockets, self.exchanges, strict=True):
                    await sock.send(plan[step][0])
                for sock, plan in zip(sockets, self.exchanges, strict=True):
                    reply = await sock.recv()
                    assert len(reply) == plan[step][1]
            count += 1
            now = time.perf_counter()
            if now >= deadline:
                return count, now - t0

    def run(self, seconds: float) -> tuple[int, float]:
        return self.loop.run_until_complete(self._run(time.perf_counter() + seconds))

    def close(self) -> None:
        for sock in self.sockets:
            self.loop.run_until_complete(sock.close())


def timed(step: Any, seconds: float) -> tuple[int, float]:
    count, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        step()
        count += 1
        now = time.perf_counter()
        if now >= deadline:
            return count, now - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 5, quick 1)")
    parser.add_argument("--seconds", type=float, help="seconds per pass (default 2.5, quick 0.4)")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    C.reexec_with_malloc_env()
    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.seconds or (0.4 if args.quick else 2.5)

    import numpy as np

    from engine.aio import LoopThread
    from engine.client import ParameterClient, ShardAddress
    from engine.keys import KeyRange, RangePartitioner
    from engine.protocol import Role
    from engine.transport.websocket import WebSocketTransport

    num_keys = C.num_model_keys()
    everything = KeyRange(0, num_keys)
    halves = RangePartitioner().ranges(num_keys, 2)
    rng = np.random.default_rng(0)
    init = rng.standard_normal(num_keys, dtype=np.float32) * np.float32(0.05)
    grad = rng.standard_normal(num_keys, dtype=np.float32) * np.float32(1e-4)
    info = C.machine_info()

    specs = [("psctl-server", ["--start", "0", "--end", str(num_keys)]), ("echo-server", [])]
    for index, half in enumerate(halves):
        specs.append(("psctl-server", ["--start", str(half.start), "--end", str(half.end),
                                       "--rank", str(index)]))
    specs += [("echo-server", []), ("echo-server", [])]

    io = LoopThread("bench-io")
    loop = asyncio.new_event_loop()
    transport = WebSocketTransport(max_frame_bytes=C.MAX_FRAME_BYTES)

    def make_client(addresses: list[str], ranges: list[KeyRange]) -> Any:
        client = ParameterClient(
            transport, [ShardAddress(i, a, r) for i, (a, r) in enumerate(
                zip(addresses, ranges, strict=True))],
            token=C.TOKEN, run=C.RUN_ID, role=Role.WORKER, rank=0, connect_timeout_s=30,
            request_timeout_s=60, max_frame_bytes=C.MAX_FRAME_BYTES, io=io)
        client.connect()
        client.wait(client.init(init))
        return client

    samples: dict[str, dict[str, list[Any]]] = {}
    with C.servers(specs) as procs:
        ps1, echo1, ps2a, ps2b, echo2a, echo2b = procs
        one = PsctlSide(make_client([ps1.address], [everything]), everything, grad,
                        np.empty(num_keys, dtype=np.float32))
        two = PsctlSide(make_client([ps2a.address, ps2b.address], halves), everything, grad,
                        np.empty(num_keys, dtype=np.float32))
        full, parts = C.frame_sizes(num_keys), [C.frame_sizes(len(h)) for h in halves]
        raw_pipelined = RawSide(loop, [echo1.address],
                                [[(C.echo_request(full["push"], full["values"]), full["values"])]])
        raw_sequential = RawSide(loop, [echo1.address], [[
            (C.echo_request(full["push"], full["ack"]), full["ack"]),
            (C.echo_request(full["pull"], full["values"]), full["values"]),
        ]])
        raw_two = RawSide(loop, [echo2a.address, echo2b.address], [
            [(C.echo_request(p["push"], p["values"]), p["values"])] for p in parts])

        variants = {
            "1 shard, pipelined": (lambda s: timed(one.pipelined, s), [ps1.pid],
                                   raw_pipelined.run, [echo1.pid]),
            "1 shard, sequential": (lambda s: timed(one.sequential, s), [ps1.pid],
                                    raw_sequential.run, [echo1.pid]),
            "2 shards, pipelined": (lambda s: timed(two.pipelined, s), [ps2a.pid, ps2b.pid],
                                    raw_two.run, [echo2a.pid, echo2b.pid]),
        }
        # warm-up: fault in buffers, fill caches, let the servers' allocators settle
        for psctl_run, _, raw_run, _ in variants.values():
            psctl_run(min(seconds, 0.5))
            raw_run(min(seconds, 0.5))

        for name in variants:
            samples[name] = {"psctl": [], "raw": [], "psctl_counters": [], "raw_counters": []}
        for round_ in range(rounds):
            for name, (psctl_run, psctl_pids, raw_run, raw_pids) in variants.items():
                order = [("psctl", psctl_run, psctl_pids), ("raw", raw_run, raw_pids)]
                if round_ % 2:
                    order.reverse()
                for side, run, pids in order:
                    counters = C.Counters(pids)
                    count, elapsed = run(seconds)
                    samples[name][side].append(count / elapsed)
                    samples[name][f"{side}_counters"].append(counters.per(count))
            print(f"round {round_ + 1}/{rounds} done", file=sys.stderr)

        for client_side in (one, two):
            client_side.client.close()
        for raw in (raw_pipelined, raw_sequential, raw_two):
            raw.close()
        server_stats = [proc.stop() for proc in procs]
    io.stop()

    results: dict[str, Any] = {}
    for name, s in samples.items():
        ratios = C.paired_ratios(s["psctl"], s["raw"])
        results[name] = {
            "psctl_rt_per_s": C.median(s["psctl"]),
            "raw_rt_per_s": C.median(s["raw"]),
            "ratio_of_medians": C.median(s["psctl"]) / C.median(s["raw"]),
            "median_paired_ratio": C.median(ratios),
            "paired_ratios": ratios,
            "psctl_per_rt": _median_counters(s["psctl_counters"]),
            "raw_per_rt": _median_counters(s["raw_counters"]),
        }
    goal = 0.8
    payload = {
        "benchmark": NAME,
        "machine": info,
        "parameters": {
            "model": f"MLP {C.INPUT_DIM}-{'-'.join(map(str, C.HIDDEN))}-{C.CLASSES}",
            "num_keys": num_keys,
            "frame_bytes": C.frame_sizes(num_keys),
            "frame_bytes_per_half": [C.frame_sizes(len(h)) for h in halves],
            "consistency": "asp (workers=1)",
            "optimizer": "sgd lr=0.1 momentum=0.9 (OptimizerConfig default)",
            "rounds": rounds,
            "seconds_per_pass": seconds,
            "quick": args.quick,
            "malloc_env_in_all_processes": C.MALLOC_ENV,
            "goal": f"psctl >= {goal} x raw",
        },
        "samples": samples,
        "results": results,
        "server_stats": server_stats,
        "loadavg_at_end": list(__import__("os").getloadavg()),
    }
    path = C.write_result(NAME, payload)
    rows = _rows(results, goal)
    print("\n".join(rows))
    print(f"\nwrote {path.relative_to(C.REPO)}", file=sys.stderr)
    if not args.quick and not args.no_docs:
        C.update_docs_section("Transport (bench/pushpull.py)", _doc(rows, info, rounds, seconds))


def _median_counters(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(C.median([r[key] for r in rows]), 3) for key in rows[0]}


def _rows(results: dict[str, Any], goal: float) -> list[str]:
    rows = [
        "| measured | psctl (RT/s) | raw websocket baseline (RT/s) | ratio | goal | met? |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        ratio = r["median_paired_ratio"]
        met = "yes" if ratio >= goal else "no"
        rows.append(
            f"| push+pull, full MLP (3.73 MB each way), {name} | {r['psctl_rt_per_s']:.0f} | "
            f"{r['raw_rt_per_s']:.0f} | {C.fmt_ratio(ratio)} | >= {goal}x | {met} |"
        )
    return rows


def _doc(rows: list[str], info: dict[str, Any], rounds: int, seconds: float) -> str:
    return "\n".join([
        "Push+pull round trips per second of the full MNIST MLP (784-512-512-512-10: 932,362 "
        "float32 keys, 3.73 MB) from one `ParameterClient` to `ShardServer` processes (ASP, "
        "default SGD with momentum applied on every push), against a raw `websockets` client "
        "and echo servers that answer with preallocated replies of psctl's exact frame sizes "
        "(compression off). *pipelined*: push and pull issued together, both awaited (raw: one "
        "push-sized frame out, one values-sized frame back); *sequential*: push, wait, pull, "
        "wait (raw: the same two exchanges); *2 shards*: two server processes, the client "
        "splits the keys (raw: half to each of two echo servers). The ratio is the median of "
        f"{rounds} per-round ratios (passes of {seconds:g} s, alternating, order reversed every "
        "other round).",
        "",
        *rows,
        "",
        "Reproduce: `python bench/pushpull.py` (about 100 s; `--quick` for a smoke test). "
        "Every process (client and servers) runs with `MALLOC_MMAP_THRESHOLD_=33554432 "
        "MALLOC_TRIM_THRESHOLD_=268435456`, as under `engine.launcher`. Raw samples, page "
        "faults and CPU ms per round trip: `bench/results/pushpull.json`.",
        "",
        f"Machine: {info['cpu_count']} vCPU {info['cpu_model']}, Python {info['python']}, "
        f"torch {info['torch']}, numpy {info['numpy']}, websockets {info['websockets']}; "
        f"load average at start {info['loadavg_at_start'][0]:.2f} (other runs were sharing "
        "the machine).",
    ])


if __name__ == "__main__":
    main()
