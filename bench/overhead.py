"""Per-iteration time of one psctl worker and one shard server versus what the parts cost alone.

psctl: the real ``engine.worker.Worker`` running its real iteration loops (``_PlainLoop``: pull,
``train_step``, push, each waited for; ``_OverlappedLoop``: the next pull prefetched during the
step, the push left in flight) against a fresh ``ShardServer`` process per pass. There is no
coordinator: the worker's ``ParameterClient`` is built by ``engine.worker.connect_client`` from a
hand-made ``Welcome``, and a stand-in for its control channel (``SyncControl``) never delivers a
message, serialises what the worker reports on the worker's I/O loop (as the real channel does)
and keeps it. The model is the MNIST MLP 784-512-512-512-10 (932,362 keys), batch 64 of random
MNIST-shaped inputs (standard normal, as the loader's standardised pixels), one torch thread.

Baselines, measured in the same process and alternated with the psctl passes:

* ``torch``: a plain PyTorch loop on the same model (an ordinary ``nn.Module``, not the flat
  buffers) with a local ``torch.optim.SGD`` step (lr 0.1, momentum 0.9), same batches.
* ``raw``: a plain ``websockets`` client (asyncio on the main thread) against an echo-server
  process, exchanging exactly the frames of one plain-loop iteration: a pull request answered by
  a values-sized frame, then a push-sized frame answered by an ack-sized frame.

Reported: psctl time per iteration / max(torch step, raw exchange) (the goal: <= 1.15), and for
the plain loop also / (torch step + raw exchange), the best a loop that waits for each phase in
turn can do.

Run: ``python bench/overhead.py`` (about 2 minutes) or ``--quick`` (a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C

NAME = "overhead"
WARMUP = 10  # iterations of every pass left out of its timing
GOAL = 1.15


class StandInControl:
    """What ``Worker`` needs of ``SyncControl``, with no coordinator behind it."""

    def __init__(self, io: Any) -> None:
        self._io = io
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)
        self._io.submit(self._serialise(message))

    def send_and_wait(self, message: Any, timeout: float = 10.0) -> None:
        self._io.call(self._serialise(message), timeout, "serialising")
        self.sent.append(message)

    def poll(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass

    @staticmethod
    async def _serialise(message: Any) -> None:
        from engine.messages import dump_control

        dump_control(message)


def psctl_pass(sync: str, overlap: bool, iterations: int, data: tuple[Any, Any],
               model: Any) -> dict[str, Any]:
    """One fresh server process, one worker run of ``iterations``; seconds per iteration."""
    from engine.aio import LoopThread
    from engine.config import RunConfig
    from engine.messages import Iterations, ShardInfo, Welcome
    from engine.protocol import Role
    from engine.transport.websocket import WebSocketTransport
    from engine.worker import Worker, connect_client, shard_for

    num_keys = model.spec.num_keys
    config = RunConfig.model_validate({
        "cluster": {"workers": 1, "servers": 1},
        "sync": {"model": sync},
        "train": {"epochs": 1, "batch_size": 64, "overlap": overlap, "torch_threads": 1},
    })
    inputs, targets = data
    shard = shard_for(inputs[: 64 * iterations], targets[: 64 * iterations], rank=0, workers=1,
                      seed=config.train.seed, batch_size=64)
    server = C.ServerProcess("psctl-server", ["--start", "0", "--end", str(num_keys),
                                              "--sync", sync, "--workers", "1"])
    io = LoopThread("bench-worker-io")
    try:
        welcome = Welcome(run_id=C.RUN_ID.hex(), config=config.to_json_dict(), num_keys=num_keys,
                          shards=[ShardInfo(index=0, address=server.address, start=0,
                                            end=num_keys)], started_at=time.time())
        client = connect_client(WebSocketTransport(max_frame_bytes=C.MAX_FRAME_BYTES), welcome,
                                config, Role.WORKER, 0, C.TOKEN, io)
        control = StandInControl(io)
        counters = C.Counters([server.pid])
        threads = {"main": threading.get_native_id(), "io": io._thread.native_id}
        before = {name: C.thread_cpu_s(tid) for name, tid in threads.items()}
        done = Worker(welcome, 0, control, client).run(shard, model)  # type: ignore[arg-type]
        cpu = counters.per(done)
        for name, tid in threads.items():
            cpu[f"client_{name}_thread_cpu_ms"] = 1e3 * (C.thread_cpu_s(tid) - before[name]) / done
        client.close()
    finally:
        io.stop()
        server.stop()
    rows = sorted((r for m in control.sent if isinstance(m, Iterations) for r in m.rows),
                  key=lambda r: r.iteration)
    assert done == iterations == len(rows), (done, iterations, len(rows))
    timed = rows[WARMUP:]
    per_iteration = (timed[-1].started_at - timed[0].started_at) / (len(timed) - 1)
    return {
        "s_per_iteration": per_iteration,
        "mean_compute_s": sum(r.compute_s for r in timed) / len(timed),
        "mean_pull_s": sum(r.pull_s for r in timed) / len(timed),
        "mean_push_s": sum(r.push_s for r in timed) / len(timed),
        "median_compute_s": C.median([r.compute_s for r in timed]),
        "median_pull_s": C.median([r.pull_s for r in timed]),
        "median_push_s": C.median([r.push_s for r in timed]),
        "median_wait_s": C.median([r.wait_s for r in timed]),
        "median_staleness": C.median([r.staleness for r in timed]),
        "last_loss": timed[-1].loss,
        "per_iteration_counters": cpu,
    }


def torch_pass(iterations: int, data: tuple[Any, Any], spec: Any) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch import nn

    from engine.model import MLP

    torch.manual_seed(0)
    module = MLP(spec)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    inputs, targets = data
    order = np.random.default_rng(0).permutation(64 * iterations)
    batches = [order[i:i + 64] for i in range(0, 64 * iterations, 64)]
    stamps, counters = [], C.Counters([])
    for batch in batches:
        stamps.append(time.perf_counter())
        x, y = torch.from_numpy(inputs[batch]), torch.from_numpy(targets[batch])
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(module(x), y)
        loss.backward()
        optimizer.step()
        float(loss.detach())
    stamps.append(time.perf_counter())
    return {"s_per_iteration": (stamps[-1] - stamps[WARMUP]) / (len(stamps) - 1 - WARMUP),
            "per_iteration_counters": counters.per(iterations)}


class RawExchange:
    """The plain-loop iteration's frames over a plain websocket: pull, then push."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, num_keys: int,
                 server_pid: int) -> None:
        self.server_pid = server_pid
        sizes = C.frame_sizes(num_keys)
        self.plan = [
            (C.echo_request(sizes["pull"], sizes["values"]), sizes["values"]),
            (C.echo_request(sizes["push"], sizes["ack"]), sizes["ack"]),
        ]
        self.loop = loop
        self.socket = loop.run_until_complete(C.echo_connect(address))

    async def _run(self, iterations: int) -> list[float]:
        stamps = []
        for _ in range(iterations):
            stamps.append(time.perf_counter())
            for request, size in self.plan:
                await self.socket.send(request)
                assert len(await self.socket.recv()) == size
        stamps.append(time.perf_counter())
        return stamps

    def run(self, iterations: int) -> dict[str, Any]:
        counters = C.Counters([self.server_pid])
        stamps = self.loop.run_until_complete(self._run(iterations))
        return {"s_per_iteration": (stamps[-1] - stamps[WARMUP]) / (len(stamps) - 1 - WARMUP),
                "per_iteration_counters": counters.per(iterations)}

    def close(self) -> None:
        self.loop.run_until_complete(self.socket.close())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 7, quick 1)")
    parser.add_argument("--iterations", type=int, help="iterations per pass (default 150)")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    C.reexec_with_malloc_env()
    rounds = args.rounds or (1 if args.quick else 7)
    iterations = args.iterations or (40 if args.quick else 150)

    import numpy as np
    import torch

    from engine.model import FlatModel
    from engine.modelspec import MLPSpec

    torch.set_num_threads(1)
    info = C.machine_info()
    spec = MLPSpec(C.INPUT_DIM, C.HIDDEN, C.CLASSES)
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((64 * iterations, C.INPUT_DIM), dtype=np.float32),
            rng.integers(0, C.CLASSES, 64 * iterations).astype(np.int64))
    model = FlatModel(spec, seed=0)
    loop = asyncio.new_event_loop()

    passes = {
        "torch": lambda: torch_pass(iterations, data, spec),
        "raw": lambda: raw.run(iterations),
        "psctl plain (bsp)": lambda: psctl_pass("bsp", False, iterations, data, model),
        "psctl plain (asp)": lambda: psctl_pass("asp", False, iterations, data, model),
        "psctl overlapped (asp)": lambda: psctl_pass("asp", True, iterations, data, model),
    }
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in passes}
    with C.servers([("echo-server", [])]) as (echo,):
        raw = RawExchange(loop, echo.address, spec.num_keys, echo.pid)
        raw.run(WARMUP + 5)
        torch_pass(WARMUP + 5, data, spec)
        names = list(passes)
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                samples[name].append(passes[name]())
            print(f"round {round_ + 1}/{rounds} done", file=sys.stderr)
        raw.close()

    per_round = {name: [s["s_per_iteration"] for s in rows] for name, rows in samples.items()}
    best = [max(t, r) for t, r in zip(per_round["torch"], per_round["raw"], strict=True)]
    serial = [t + r for t, r in zip(per_round["torch"], per_round["raw"], strict=True)]
    def counters(name: str) -> dict[str, float]:
        rows = [s["per_iteration_counters"] for s in samples[name]]
        return {key: round(C.median([r[key] for r in rows]), 3) for key in rows[0]}

    results: dict[str, Any] = {
        "torch_ms": 1e3 * C.median(per_round["torch"]),
        "raw_ms": 1e3 * C.median(per_round["raw"]),
        "torch_per_iteration_counters": counters("torch"),
        "raw_per_iteration_counters": counters("raw"),
    }
    for name in names[2:]:
        vs_max = C.paired_ratios(per_round[name], best)
        vs_sum = C.paired_ratios(per_round[name], serial)
        results[name] = {
            "ms_per_iteration": 1e3 * C.median(per_round[name]),
            "ratio_vs_max": C.median(vs_max),
            "ratios_vs_max": vs_max,
            "ratio_vs_sum": C.median(vs_sum),
            "ratios_vs_sum": vs_sum,
            "median_breakdown_ms": {
                key: 1e3 * C.median([s[f"median_{key}_s"] for s in samples[name]])
                for key in ("compute", "pull", "push", "wait")
            },
            "mean_breakdown_ms": {
                key: 1e3 * C.median([s[f"mean_{key}_s"] for s in samples[name]])
                for key in ("compute", "pull", "push")
            },
            "per_iteration_counters": counters(name),
            "last_loss": samples[name][-1]["last_loss"],
        }
    payload = {
        "benchmark": NAME,
        "machine": info,
        "parameters": {
            "model": f"MLP {C.INPUT_DIM}-{'-'.join(map(str, C.HIDDEN))}-{C.CLASSES}",
            "num_keys": spec.num_keys,
            "batch_size": 64,
            "iterations_per_pass": iterations,
            "warmup_iterations_left_out": WARMUP,
            "rounds": rounds,
            "torch_threads": 1,
            "server": "fresh ShardServer process per psctl pass; SGD lr 0.1 momentum 0.9",
            "worker": "engine.worker.Worker with _PlainLoop/_OverlappedLoop; stand-in control",
            "frame_bytes": C.frame_sizes(spec.num_keys),
            "quick": args.quick,
            "malloc_env_in_all_processes": C.MALLOC_ENV,
            "goal": f"psctl <= {GOAL} x max(torch step, raw exchange)",
        },
        "samples": samples,
        "results": results,
        "loadavg_at_end": list(__import__("os").getloadavg()),
    }
    path = C.write_result(NAME, payload)
    rows = _rows(results)
    print("\n".join(rows))
    print(f"\nwrote {path.relative_to(C.REPO)}", file=sys.stderr)
    if not args.quick and not args.no_docs:
        C.update_docs_section("Worker overhead (bench/overhead.py)",
                              _doc(rows, info, rounds, iterations))


def _rows(results: dict[str, Any]) -> list[str]:
    torch_ms, raw_ms = results["torch_ms"], results["raw_ms"]
    rows = [
        "| measured (ms per iteration) | psctl | baseline: max(torch step, raw exchange) | "
        "ratio | goal | met? | ratio to torch + raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if not name.startswith("psctl"):
            continue
        ratio = r["ratio_vs_max"]
        rows.append(
            f"| 1 worker + 1 server, {name} | {r['ms_per_iteration']:.1f} | "
            f"max({torch_ms:.1f}, {raw_ms:.1f}) | {C.fmt_ratio(ratio)} | <= {GOAL}x | "
            f"{'yes' if ratio <= GOAL else 'no'} | {C.fmt_ratio(r['ratio_vs_sum'])} |"
        )
    return rows


def _doc(rows: list[str], info: dict[str, Any], rounds: int, iterations: int) -> str:
    return "\n".join([
        "Time per training iteration of one worker and one shard server process: the real "
        "`engine.worker.Worker` and its `_PlainLoop` / `_OverlappedLoop` (the worker's client "
        "comes from `engine.worker.connect_client`; there is no coordinator, a stand-in control "
        "channel serialises the worker's reports and delivers nothing), MNIST MLP 784-512-512-"
        "512-10, batch 64 of random MNIST-shaped inputs, one torch thread, a fresh server "
        "process per pass. Baselines in the same script: a plain PyTorch step on the same model "
        "(`torch.optim.SGD` local step, lr 0.1, momentum 0.9, same batches) and a raw "
        "`websockets` exchange of the same frames (pull request -> values, push -> ack) against "
        "an echo-server process. The ratio is psctl / max(torch step, raw exchange), the median "
        f"of {rounds} per-round ratios ({iterations} iterations per pass, the first {WARMUP} "
        "left out; passes alternate, order reversed every other round). The last column divides "
        "by torch step + raw exchange instead: the plain loop waits for each phase in turn, so "
        "that sum, not the max, is the best it can reach.",
        "",
        *rows,
        "",
        "Reproduce: `python bench/overhead.py` (about 2 minutes; `--quick` for a smoke test). "
        "Every process runs with `MALLOC_MMAP_THRESHOLD_=33554432 "
        "MALLOC_TRIM_THRESHOLD_=268435456`, as under `engine.launcher`. Per-phase medians "
        "(compute, pull, push, wait), CPU ms and page faults per iteration: "
        "`bench/results/overhead.json`.",
        "",
        f"Machine: {info['cpu_count']} vCPU {info['cpu_model']}, Python {info['python']}, "
        f"torch {info['torch']}, numpy {info['numpy']}, websockets {info['websockets']}; "
        f"load average at start {info['loadavg_at_start'][0]:.2f} (other runs were sharing "
        "the machine).",
    ])


if __name__ == "__main__":
    main()
