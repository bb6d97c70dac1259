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
* ``..., tcp``: the same psctl exchanges with the shard servers listening on the TCP transport
  (``--transport tcp``); the baseline stays the raw websocket exchange.
* ``no optimizer`` (a diagnostic, not a goal): pipelined, 1 shard, against a server whose
  optimizer applies nothing, to show by difference what the SGD update costs.

``--no-malloc-env`` runs every process without the malloc settings (results go to
``bench/results/pushpull_no_malloc_env.json``; docs untouched), to measure what they are worth.

Run: ``python bench/pushpull.py`` (about 3 minutes) or ``--quick`` (a few seconds).
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
TWO_SHARD_GOAL = 0.7
DIAGNOSTIC = "1 shard, pipelined, server applies no update (diagnostic)"


@dataclass
class PsctlSide:
    client: Any
    keys: Any
    grad: Any
    out: Any
    clock: int = 0
    versions: dict[int, int] = field(default_factory=dict)

    def pipelined(self) -> None:
        push = self.client.push(self.keys, self.grad, clock=self.clock, base_versions=self.versions)
        pull = self.client.pull(self.keys, self.out, clock=self.clock + 1)
        self.client.wait(push)
        self.versions = self.client.wait(pull).versions
        self.clock += 1

    def sequential(self) -> None:
        self.client.wait(
            self.client.push(self.keys, self.grad, clock=self.clock, base_versions=self.versions)
        )
        self.clock += 1
        self.versions = self.client.wait(
            self.client.pull(self.keys, self.out, clock=self.clock)
        ).versions


class RawSide:
    """Plain websockets client on an asyncio loop run by the main thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        addresses: list[str],
        exchanges: list[list[tuple[bytes, int]]],
    ) -> None:
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
    parser.add_argument("--seconds", type=float, help="seconds per pass (default 2, quick 0.3)")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument(
        "--no-malloc-env",
        action="store_true",
        help="run every process without the MALLOC_* settings",
    )
    args = parser.parse_args()
    C.reexec_with_malloc_env()
    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.seconds or (0.3 if args.quick else 2.0)
    result_name = NAME + ("_no_malloc_env" if args.no_malloc_env else "")

    import numpy as np

    from engine.aio import LoopThread
    from engine.keys import KeyRange, RangePartitioner
    from engine.transport.schemes import SchemeTransport
    from engine.wire.protocol import Role
    from engine.worker.client import ParameterClient, ShardAddress

    num_keys = C.num_model_keys()
    everything = KeyRange(0, num_keys)
    halves = RangePartitioner().ranges(num_keys, 2)
    rng = np.random.default_rng(0)
    init = rng.standard_normal(num_keys, dtype=np.float32) * np.float32(0.05)
    grad = rng.standard_normal(num_keys, dtype=np.float32) * np.float32(1e-4)
    info = C.machine_info()

    specs = [("psctl-server", ["--start", "0", "--end", str(num_keys)]), ("echo-server", [])]
    for index, half in enumerate(halves):
        specs.append(
            (
                "psctl-server",
                ["--start", str(half.start), "--end", str(half.end), "--rank", str(index)],
            )
        )
    specs += [("echo-server", []), ("echo-server", [])]
    specs.append(("psctl-server", ["--start", "0", "--end", str(num_keys), "--optimizer", "none"]))
    tcp = ["--transport", "tcp"]
    specs.append(("psctl-server", ["--start", "0", "--end", str(num_keys), *tcp]))
    for index, half in enumerate(halves):
        specs.append(("psctl-server", ["--start", str(half.start), "--end", str(half.end),
                                       "--rank", str(index), *tcp]))

    io = LoopThread("bench-io")
    loop = asyncio.new_event_loop()
    transport = SchemeTransport(max_frame_bytes=C.MAX_FRAME_BYTES)  # ws:// or tcp://

    def make_client(addresses: list[str], ranges: list[KeyRange]) -> Any:
        client = ParameterClient(
            transport,
            [ShardAddress(i, a, r) for i, (a, r) in enumerate(zip(addresses, ranges, strict=True))],
            token=C.TOKEN,
            run=C.RUN_ID,
            role=Role.WORKER,
            rank=0,
            connect_timeout_s=30,
            request_timeout_s=60,
            max_frame_bytes=C.MAX_FRAME_BYTES,
            io=io,
        )
        client.connect()
        client.wait(client.init(init))
        return client

    samples: dict[str, dict[str, list[Any]]] = {}
    with C.servers(specs) as procs:
        ps1, echo1, ps2a, ps2b, echo2a, echo2b, ps_noopt, ps1t, ps2at, ps2bt = procs
        one = PsctlSide(
            make_client([ps1.address], [everything]),
            everything,
            grad,
            np.empty(num_keys, dtype=np.float32),
        )
        two = PsctlSide(
            make_client([ps2a.address, ps2b.address], halves),
            everything,
            grad,
            np.empty(num_keys, dtype=np.float32),
        )
        noopt = PsctlSide(
            make_client([ps_noopt.address], [everything]),
            everything,
            grad,
            np.empty(num_keys, dtype=np.float32),
        )
        one_tcp = PsctlSide(make_client([ps1t.address], [everything]), everything, grad,
                            np.empty(num_keys, dtype=np.float32))
        two_tcp = PsctlSide(make_client([ps2at.address, ps2bt.address], halves), everything,
                            grad, np.empty(num_keys, dtype=np.float32))
        full, parts = C.frame_sizes(num_keys), [C.frame_sizes(len(h)) for h in halves]
        raw_pipelined = RawSide(
            loop,
            [echo1.address],
            [[(C.echo_request(full["push"], full["values"]), full["values"])]],
        )
        raw_sequential = RawSide(
            loop,
            [echo1.address],
            [
                [
                    (C.echo_request(full["push"], full["ack"]), full["ack"]),
                    (C.echo_request(full["pull"], full["values"]), full["values"]),
                ]
            ],
        )
        raw_two = RawSide(
            loop,
            [echo2a.address, echo2b.address],
            [[(C.echo_request(p["push"], p["values"]), p["values"])] for p in parts],
        )

        variants = {
            "1 shard, pipelined": (
                lambda s: timed(one.pipelined, s),
                [ps1.pid],
                raw_pipelined.run,
                [echo1.pid],
            ),
            "1 shard, sequential": (
                lambda s: timed(one.sequential, s),
                [ps1.pid],
                raw_sequential.run,
                [echo1.pid],
            ),
            "2 shards, pipelined": (
                lambda s: timed(two.pipelined, s),
                [ps2a.pid, ps2b.pid],
                raw_two.run,
                [echo2a.pid, echo2b.pid],
            ),
            "1 shard, pipelined, tcp": (
                lambda s: timed(one_tcp.pipelined, s),
                [ps1t.pid],
                raw_pipelined.run,
                [echo1.pid],
            ),
            "1 shard, sequential, tcp": (
                lambda s: timed(one_tcp.sequential, s),
                [ps1t.pid],
                raw_sequential.run,
                [echo1.pid],
            ),
            "2 shards, pipelined, tcp": (
                lambda s: timed(two_tcp.pipelined, s),
                [ps2at.pid, ps2bt.pid],
                raw_two.run,
                [echo2a.pid, echo2b.pid],
            ),
            DIAGNOSTIC: (
                lambda s: timed(noopt.pipelined, s),
                [ps_noopt.pid],
                raw_pipelined.run,
                [echo1.pid],
            ),
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

        for client_side in (one, two, noopt, one_tcp, two_tcp):
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
    goal = 0.8  # 1 shard; 2 shards: TWO_SHARD_GOAL
    payload = {
        "benchmark": NAME,
        "machine": info,
        "parameters": {
            "model": f"MLP {C.INPUT_DIM}-{'-'.join(map(str, C.HIDDEN))}-{C.CLASSES}",
            "num_keys": num_keys,
            "frame_bytes": C.frame_sizes(num_keys),
            "frame_bytes_per_half": [C.frame_sizes(len(h)) for h in halves],
            "consistency": "asp (workers=1)",
            "optimizer": "sgd lr=0.1 momentum=0.9 (OptimizerConfig default); none in the "
            "diagnostic variant",
            "rounds": rounds,
            "seconds_per_pass": seconds,
            "quick": args.quick,
            "malloc_env_in_all_processes": None if args.no_malloc_env else C.MALLOC_ENV,
            "goal": f"psctl >= {goal} x raw (1 shard), >= {TWO_SHARD_GOAL} x raw (2 shards)",
        },
        "samples": samples,
        "results": results,
        "server_stats": server_stats,
        "loadavg_at_end": list(__import__("os").getloadavg()),
    }
    path = C.write_result(result_name, payload)
    rows = [*_rows(results, goal), "", _cpu_line(results), "", _update_cost(results)]
    print("\n".join(rows))
    print(f"\nwrote {path.relative_to(C.REPO)}", file=sys.stderr)
    if not (args.quick or args.no_docs or args.no_malloc_env):
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
        wanted = TWO_SHARD_GOAL if name.startswith("2 shards") else goal
        met = "n/a" if name == DIAGNOSTIC else "yes" if ratio >= wanted else "no"
        rows.append(
            f"| push+pull, full MLP (3.73 MB each way), {name} | {r['psctl_rt_per_s']:.0f} | "
            f"{r['raw_rt_per_s']:.0f} | {C.fmt_ratio(ratio)} | "
            f"{'-' if met == 'n/a' else f'>= {wanted}x'} | {met} |"
        )
    return rows


def _update_cost(results: dict[str, Any]) -> str:
    with_sgd = 1e3 / results["1 shard, pipelined"]["psctl_rt_per_s"]
    without = 1e3 / results[DIAGNOSTIC]["psctl_rt_per_s"]
    raw = 1e3 / results["1 shard, pipelined"]["raw_rt_per_s"]
    return (
        f"Time per round trip (medians): psctl {with_sgd:.2f} ms, psctl with a server that "
        f"applies no update {without:.2f} ms, raw {raw:.2f} ms: the server's SGD update "
        f"accounts for about {with_sgd - without:.2f} ms of the {with_sgd - raw:.2f} ms psctl "
        "spends over raw."
    )


def _cpu_line(results: dict[str, Any]) -> str:
    parts = []
    for name, r in results.items():
        p, q = r["psctl_per_rt"], r["raw_per_rt"]
        parts.append(
            f"{name}: psctl {p['client_cpu_ms']:.1f} client + {p['server_cpu_ms']:.1f} server, "
            f"raw {q['client_cpu_ms']:.1f} + {q['server_cpu_ms']:.1f}"
        )
    return "CPU ms per round trip (medians): " + "; ".join(parts) + "."


def _doc(rows: list[str], info: dict[str, Any], rounds: int, seconds: float) -> str:
    intro = C.paragraph(f"""
        Push+pull round trips per second of the full MNIST MLP (784-512-512-512-10: 932,362
        float32 keys, 3.73 MB) from one `ParameterClient` to `ShardServer` processes (ASP, the
        default SGD with momentum applied on every push), against a raw `websockets` client and
        echo-server processes that answer with preallocated replies of psctl's exact frame sizes
        (compression off). *pipelined*: push and pull issued together, both awaited (raw: one
        push-sized frame out, one values-sized frame back); *sequential*: push, wait, pull, wait
        (raw: the same two exchanges); *2 shards*: two server processes, the client splits the
        keys (raw: half to each of two echo servers). *tcp*: the same psctl exchanges with the
        servers on the TCP transport (`--transport tcp`), against the same raw websocket
        baseline. The last row is a diagnostic: a server
        whose optimizer applies nothing, so its difference to the first row is what the
        SGD-with-momentum update costs. The ratio is the median of {rounds} per-round ratios
        (passes of {seconds:g} s, alternating, order reversed every other round).
        """)
    reproduce = C.paragraph("""
        Reproduce: `python bench/pushpull.py` (about 3 minutes; `--quick` for a smoke test). Every
        process (client and servers) runs with `MALLOC_MMAP_THRESHOLD_=33554432
        MALLOC_TRIM_THRESHOLD_=268435456`, as under `engine.launcher` (`--no-malloc-env` runs
        without them and writes `bench/results/pushpull_no_malloc_env.json`). Raw samples, page
        faults and CPU ms per round trip: `bench/results/pushpull.json`.
        """)
    return "\n".join([intro, "", *C.wrap_lines(rows), "", reproduce, "", C.machine_note(info)])


if __name__ == "__main__":
    main()
