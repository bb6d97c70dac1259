"""Per-iteration time of one psctl worker and one shard server versus what the parts cost alone.

psctl: the real ``engine.worker.Worker`` running its real iteration loops (``PlainLoop``: pull,
``train_step``, push, each waited for; ``OverlappedLoop``: the next pull prefetched during the
step, the push left in flight) against a fresh ``ShardServer`` process per pass. There is no
coordinator: the worker's ``ParameterClient`` is built by
``engine.roles.worker.connect_client`` from a
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

* ``raw loop``: the plain loop written with raw websockets on the main thread: a torch step,
  then the raw exchange, with the copies psctl makes (pulled values into a flat buffer, a flat
  gradient into the push frame).

Reported: psctl time per iteration / max(torch step, raw exchange) (the goal: <= 1.15); for
context also / (torch step + raw exchange), the best a loop that waits for each phase in turn
can do, and / raw loop.

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
# issue 20, acceptance 2: the plain BSP loop within 1.3x, the overlapped loop within 1.15x
GOALS = {"psctl plain (bsp)": 1.3, "psctl overlapped (asp)": 1.15}
WAITING = "psctl plain (bsp), --no-pipeline"
WEBSOCKET = "psctl plain (bsp), --transport websocket"
LAYER_PULLS = "psctl wait-free (bsp), --layer-pulls"


class StandInControl:
    """What ``Worker`` needs of ``SyncControl``, with no coordinator behind it."""

    def __init__(self, io: Any) -> None:
        self._io = io
        self.sent: list[Any] = []
        self._started = False

    def send(self, message: Any) -> None:
        self.sent.append(message)
        self._io.submit(self._serialise(message))

    def send_and_wait(self, message: Any, timeout: float = 10.0) -> None:
        self._io.call(self._serialise(message), timeout, "serialising")
        self.sent.append(message)

    def poll(self) -> list[Any]:
        from engine.wire.messages import Start

        started, self._started = self._started, True
        return [] if started else [Start()]  # the only worker is ready: start at once

    def close(self) -> None:
        pass

    @staticmethod
    async def _serialise(message: Any) -> None:
        from engine.wire.messages import dump_control

        dump_control(message)


def psctl_pass(
    sync: str,
    overlap: bool,
    iterations: int,
    data: tuple[Any, Any],
    model: Any,
    pipeline: bool = True,
    loop: str = "auto",
    transport: str = "tcp",
    layer_pulls: bool = False,
) -> dict[str, Any]:
    """One fresh server process, one worker run of ``iterations``; seconds per iteration.
    ``pipeline``: ``train.pipeline``, the plain loop's next pull sent behind each push;
    ``loop``: ``train.loop`` (layered, wait-free: one frame per layer); ``transport``:
    ``cluster.transport``, what the server listens on; ``layer_pulls``: ``train.layer_pulls``
    (wait-free: each layer's next pull sent from inside backward)."""
    from engine.aio import LoopThread
    from engine.plan import parse_config
    from engine.policies.loops import WORKER_LOOPS, loop_name
    from engine.roles.worker import connect_client
    from engine.transport.schemes import SchemeTransport
    from engine.wire.messages import Iterations, ShardInfo, Welcome, layout_info
    from engine.wire.protocol import Role
    from engine.worker.loops import Worker, shard_for

    num_keys = model.num_keys
    config = parse_config(
        {
            "cluster": {"workers": 1, "servers": 1},
            "sync": {"model": sync},
            "train": {"epochs": 1, "batch_size": 64, "overlap": overlap, "torch_threads": 1,
                      "pipeline": pipeline, "loop": loop, "layer_pulls": layer_pulls},
        }
    )
    inputs, targets = data
    shard = shard_for(
        inputs[: 64 * iterations],
        targets[: 64 * iterations],
        rank=0,
        workers=1,
        seed=config.train.seed,
        batch_size=64,
    )
    server = C.ServerProcess(
        "psctl-server", ["--start", "0", "--end", str(num_keys), "--sync", sync, "--workers", "1",
                         "--transport", transport]
    )
    io = LoopThread("bench-worker-io")
    try:
        welcome = Welcome(
            run_id=C.RUN_ID.hex(),
            config=config.to_json_dict(),
            num_keys=num_keys,
            segments=layout_info(model.layout),
            shards=[ShardInfo(index=0, address=server.address, start=0, end=num_keys)],
            started_at=time.time(),
        )
        client = connect_client(
            SchemeTransport(max_frame_bytes=C.MAX_FRAME_BYTES),
            welcome,
            config,
            Role.WORKER,
            0,
            C.TOKEN,
            io,
        )
        control = StandInControl(io)
        counters = C.Counters([server.pid])
        threads = {"main": threading.get_native_id(), "io": io._thread.native_id}
        before = {name: C.thread_cpu_s(tid) for name, tid in threads.items()}
        done = Worker(welcome, 0, control, client).run(  # type: ignore[arg-type]
            shard, model, WORKER_LOOPS.get(loop_name(config)))
        cpu = counters.per(done)
        for name, tid in threads.items():
            cpu[f"client_{name}_thread_cpu_ms"] = 1e3 * (C.thread_cpu_s(tid) - before[name]) / done
        client.close()
    finally:
        io.stop()
        server.stop()
    rows = sorted(
        (r for m in control.sent if isinstance(m, Iterations) for r in m.rows),
        key=lambda r: r.iteration,
    )
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


class TorchLoop:
    """A plain PyTorch training step on an ordinary ``nn.Module`` with a local SGD optimizer."""

    def __init__(self, iterations: int, data: tuple[Any, Any], spec: Any) -> None:
        import numpy as np
        import torch

        from engine.models.flat import MLP

        torch.manual_seed(0)
        self.module = MLP(spec)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1, momentum=0.9)
        self.inputs, self.targets = data
        order = np.random.default_rng(0).permutation(64 * iterations)
        self.batches = [order[i : i + 64] for i in range(0, 64 * iterations, 64)]

    def step(self, index: int) -> float:
        import torch
        from torch import nn

        batch = self.batches[index]
        x, y = torch.from_numpy(self.inputs[batch]), torch.from_numpy(self.targets[batch])
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.module(x), y)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def _per_iteration(stamps: list[float]) -> float:
    return (stamps[-1] - stamps[WARMUP]) / (len(stamps) - 1 - WARMUP)


def torch_pass(iterations: int, data: tuple[Any, Any], spec: Any) -> dict[str, Any]:
    steps = TorchLoop(iterations, data, spec)
    stamps, counters = [], C.Counters([])
    for index in range(iterations):
        stamps.append(time.perf_counter())
        steps.step(index)
    stamps.append(time.perf_counter())
    return {
        "s_per_iteration": _per_iteration(stamps),
        "per_iteration_counters": counters.per(iterations),
    }


class RawExchange:
    """The plain-loop iteration's frames over a plain websocket: pull, then push.

    ``run`` times the exchange alone. ``run_loop`` is the plain loop written with raw websockets
    on the main thread: a torch step, then the exchange, with the copies psctl's loop makes
    (the pulled values into a flat float32 buffer, a flat gradient into the push frame).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, address: str, num_keys: int, server_pid: int
    ) -> None:
        import numpy as np

        self.server_pid = server_pid
        sizes = C.frame_sizes(num_keys)
        self.plan = [
            (C.echo_request(sizes["pull"], sizes["values"]), sizes["values"]),
            (C.echo_request(sizes["push"], sizes["ack"]), sizes["ack"]),
        ]
        self.num_keys = num_keys
        self.params = np.zeros(num_keys, dtype=np.float32)
        self.grads = np.ones(num_keys, dtype=np.float32)
        self.loop = loop
        self.socket = loop.run_until_complete(C.echo_connect(address))

    async def _exchange(self, copies: bool) -> None:
        import numpy as np

        (pull, values), (push, ack) = self.plan
        await self.socket.send(pull)
        reply = await self.socket.recv()
        assert len(reply) == values
        if copies:
            payload = np.frombuffer(
                reply, np.float32, self.num_keys, len(reply) - 4 * self.num_keys
            )
            np.copyto(self.params, payload)
            frame = bytearray(push)
            np.copyto(
                np.frombuffer(frame, np.float32, self.num_keys, len(push) - 4 * self.num_keys),
                self.grads,
            )
            push = frame
        await self.socket.send(push)
        assert len(await self.socket.recv()) == ack

    def run(self, iterations: int, steps: TorchLoop | None = None) -> dict[str, Any]:
        counters = C.Counters([self.server_pid])
        stamps = []
        for index in range(iterations):
            stamps.append(time.perf_counter())
            if steps is not None:
                steps.step(index)
            self.loop.run_until_complete(self._exchange(copies=steps is not None))
        stamps.append(time.perf_counter())
        return {
            "s_per_iteration": _per_iteration(stamps),
            "per_iteration_counters": counters.per(iterations),
        }

    def run_loop(self, iterations: int, data: tuple[Any, Any], spec: Any) -> dict[str, Any]:
        return self.run(iterations, TorchLoop(iterations, data, spec))

    def close(self) -> None:
        self.loop.run_until_complete(self.socket.close())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 9, quick 1)")
    parser.add_argument("--iterations", type=int, help="iterations per pass (default 150)")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    C.reexec_with_malloc_env()
    rounds = args.rounds or (1 if args.quick else 9)
    iterations = args.iterations or (40 if args.quick else 150)

    import numpy as np
    import torch

    from engine.models.flat import FlatModel
    from engine.models.spec import MLPSpec

    torch.set_num_threads(1)
    info = C.machine_info()
    spec = MLPSpec(C.INPUT_DIM, C.HIDDEN, C.CLASSES)
    rng = np.random.default_rng(0)
    data = (
        rng.standard_normal((64 * iterations, C.INPUT_DIM), dtype=np.float32),
        rng.integers(0, C.CLASSES, 64 * iterations).astype(np.int64),
    )
    model = FlatModel(spec, seed=0)
    initial = model.params_np.copy()

    def psctl(sync: str, overlap: bool, **options: Any) -> dict[str, Any]:
        # Every pass trains from the same initial values (the worker sends its own to the
        # server): passes that went on from the last one's diverged after enough of them.
        np.copyto(model.params_np, initial)
        return psctl_pass(sync, overlap, iterations, data, model, **options)

    loop = asyncio.new_event_loop()

    passes = {
        "torch": lambda: torch_pass(iterations, data, spec),
        "raw": lambda: raw.run(iterations),
        "raw loop": lambda: raw.run_loop(iterations, data, spec),
        "psctl plain (bsp)": lambda: psctl("bsp", False),
        WAITING: lambda: psctl("bsp", False, pipeline=False),
        "psctl layered (bsp)": lambda: psctl("bsp", False, loop="layered"),
        "psctl wait-free (bsp)": lambda: psctl("bsp", False, loop="wait-free"),
        LAYER_PULLS: lambda: psctl("bsp", False, loop="wait-free", layer_pulls=True),
        WEBSOCKET: lambda: psctl("bsp", False, transport="websocket"),
        "psctl plain (asp)": lambda: psctl("asp", False),
        "psctl overlapped (asp)": lambda: psctl("asp", True),
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
    raw_loop = per_round["raw loop"]

    def counters(name: str) -> dict[str, float]:
        rows = [s["per_iteration_counters"] for s in samples[name]]
        return {key: round(C.median([r[key] for r in rows]), 3) for key in rows[0]}

    results: dict[str, Any] = {
        "torch_ms": 1e3 * C.median(per_round["torch"]),
        "raw_ms": 1e3 * C.median(per_round["raw"]),
        "raw_loop_ms": 1e3 * C.median(raw_loop),
        "torch_per_iteration_counters": counters("torch"),
        "raw_per_iteration_counters": counters("raw"),
        "raw_loop_per_iteration_counters": counters("raw loop"),
    }
    for name in names:
        if not name.startswith("psctl"):
            continue
        vs_max = C.paired_ratios(per_round[name], best)
        vs_sum = C.paired_ratios(per_round[name], serial)
        vs_loop = C.paired_ratios(per_round[name], raw_loop)
        results[name] = {
            "ms_per_iteration": 1e3 * C.median(per_round[name]),
            "ratio_vs_max": C.median(vs_max),
            "ratios_vs_max": vs_max,
            "ratio_vs_sum": C.median(vs_sum),
            "ratios_vs_sum": vs_sum,
            "ratio_vs_raw_loop": C.median(vs_loop),
            "ratios_vs_raw_loop": vs_loop,
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
    results["pipelined_vs_waiting_bsp"] = C.median(
        C.paired_ratios(per_round["psctl plain (bsp)"], per_round[WAITING])
    )
    results["tcp_vs_websocket_bsp"] = C.median(
        C.paired_ratios(per_round["psctl plain (bsp)"], per_round[WEBSOCKET])
    )
    results["wait_free_vs_layered_bsp"] = C.median(
        C.paired_ratios(per_round["psctl wait-free (bsp)"], per_round["psctl layered (bsp)"])
    )
    results["layer_pulls_vs_one_pull_wait_free"] = C.median(
        C.paired_ratios(per_round[LAYER_PULLS], per_round["psctl wait-free (bsp)"])
    )
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
            "worker": "engine.worker.Worker with PlainLoop/OverlappedLoop; stand-in control",
            "frame_bytes": C.frame_sizes(spec.num_keys),
            "quick": args.quick,
            "malloc_env_in_all_processes": C.MALLOC_ENV,
            "goals": {name: f"<= {goal} x max(torch step, raw exchange)"
                      for name, goal in GOALS.items()},
        },
        "samples": samples,
        "results": results,
        "loadavg_at_end": list(__import__("os").getloadavg()),
    }
    path = C.write_result(NAME, payload)
    rows = [*_rows(results), "", _cpu_line(results), "", _findings(results)]
    print("\n".join(rows))
    print(f"\nwrote {path.relative_to(C.REPO)}", file=sys.stderr)
    if not args.quick and not args.no_docs:
        C.update_docs_section(
            "Worker overhead (bench/overhead.py)", _doc(rows, info, rounds, iterations)
        )


def _rows(results: dict[str, Any]) -> list[str]:
    torch_ms, raw_ms, loop_ms = results["torch_ms"], results["raw_ms"], results["raw_loop_ms"]
    rows = [
        "| measured (ms per iteration) | psctl | baseline: max(torch step, raw exchange) | "
        f"ratio | goal | met? | ratio to torch + raw ({torch_ms + raw_ms:.1f}) | "
        f"ratio to raw loop ({loop_ms:.1f}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if not name.startswith("psctl"):
            continue
        ratio, goal = r["ratio_vs_max"], GOALS.get(name)
        met = "n/a" if goal is None else "yes" if ratio <= goal else "no"
        rows.append(
            f"| 1 worker + 1 server, {name} | {r['ms_per_iteration']:.1f} | "
            f"max({torch_ms:.1f}, {raw_ms:.1f}) | {C.fmt_ratio(ratio)} | "
            f"{'-' if goal is None else f'<= {goal}x'} | {met} | "
            f"{C.fmt_ratio(r['ratio_vs_sum'])} | {C.fmt_ratio(r['ratio_vs_raw_loop'])} |"
        )
    return rows


def _findings(results: dict[str, Any]) -> str:
    best = max(results["torch_ms"], results["raw_ms"])
    c = results["psctl overlapped (asp)"]["per_iteration_counters"]
    cpu = c["client_main_thread_cpu_ms"] + c["client_io_thread_cpu_ms"] + c["server_cpu_ms"]
    return (
        f"The overlapped loop burns {cpu:.1f} ms of CPU per iteration (worker main and I/O "
        f"threads and server); on 2 vCPUs that alone needs at least {cpu / 2:.1f} ms of wall "
        f"time, {cpu / 2 / best:.2f}x the baseline, before any waiting. The plain BSP loop with "
        f"its next pull sent behind each push (`--pipeline`, the default) takes "
        f"{results['pipelined_vs_waiting_bsp']:.2f}x the time of the same loop waiting for each "
        "ack first (`--no-pipeline`), median of the per-round ratios. The wait-free loop (each "
        "layer pushed from inside backward) takes "
        f"{results['wait_free_vs_layered_bsp']:.2f}x the time of the layered loop, which sends "
        "the same frames once backward is done; with `--layer-pulls` (each layer's next pull "
        "sent from inside backward, right behind its push) it takes "
        f"{results['layer_pulls_vs_one_pull_wait_free']:.2f}x the time of its default, one "
        "pull of the whole model after backward. Every psctl pass but one runs on the TCP "
        "transport (the default); the plain BSP loop on it takes "
        f"{results['tcp_vs_websocket_bsp']:.2f}x the time of the same loop with "
        "`--transport websocket`."
    )


def _cpu_line(results: dict[str, Any]) -> str:
    torch_cpu = results["torch_per_iteration_counters"]["client_cpu_ms"]
    raw = results["raw_per_iteration_counters"]
    parts = [
        f"CPU ms per iteration (medians): torch step {torch_cpu:.1f}; raw exchange "
        f"{raw['client_cpu_ms']:.1f} client + {raw['server_cpu_ms']:.1f} echo server; raw loop "
        f"{results['raw_loop_per_iteration_counters']['client_cpu_ms']:.1f} client + "
        f"{results['raw_loop_per_iteration_counters']['server_cpu_ms']:.1f} echo server"
    ]
    for name, r in results.items():
        if name.startswith("psctl"):
            c = r["per_iteration_counters"]
            parts.append(
                f"{name}: worker main thread {c['client_main_thread_cpu_ms']:.1f} + worker I/O "
                f"thread {c['client_io_thread_cpu_ms']:.1f} + server {c['server_cpu_ms']:.1f}"
            )
    return "; ".join(parts) + " (2 vCPUs in all)."


def _doc(rows: list[str], info: dict[str, Any], rounds: int, iterations: int) -> str:
    intro = C.paragraph(f"""
        Time per training iteration of one worker and one shard server process: the real
        `engine.worker.Worker` and its `PlainLoop` / `LayeredLoop` / `WaitFreeLoop` /
        `OverlappedLoop` (its client built by
        `engine.roles.worker.connect_client`; no coordinator: a stand-in control channel serialises
        the worker's reports on its I/O thread and delivers nothing), MNIST MLP
        784-512-512-512-10, batch 64 of random MNIST-shaped inputs, one torch thread, a fresh
        server process per pass (SGD, lr 0.1, momentum 0.9), on the TCP transport (the default)
        unless the row says websocket. Baselines in the same script: a
        plain PyTorch step on the same model (`torch.optim.SGD` local step, lr 0.1, momentum
        0.9, same batches) and a raw `websockets` exchange of the same frames (pull request ->
        values, push -> ack) with an echo-server process. The ratio is psctl / max(torch step,
        raw exchange), the median of {rounds} per-round ratios ({iterations} iterations per
        pass, the first {WARMUP} left out; passes alternate, order reversed every other round).
        The last two columns are for context. *torch + raw*: the sum of the two baselines; the
        plain loop waits for each phase in turn, so the sum, not the max, bounds it. *raw
        loop*: the plain loop written with raw websockets on the main thread (a torch step,
        then the same two exchanges, with the two 3.7 MB copies psctl's loop makes), measured
        as a pass of its own; it is slower than the sum because the step and the exchange
        evict each other's data from the caches.
        """)
    reproduce = C.paragraph("""
        Reproduce: `python bench/overhead.py` (about 2 minutes; `--quick` for a smoke test).
        Every process runs with `MALLOC_MMAP_THRESHOLD_=33554432
        MALLOC_TRIM_THRESHOLD_=268435456`, as under `engine.launcher`. Per-phase medians and
        means (compute, pull, push, wait), CPU ms per thread and page faults per iteration (the
        psctl passes' counters cover the whole pass, start-up included):
        `bench/results/overhead.json`.
        """)
    return "\n".join([intro, "", *C.wrap_lines(rows), "", reproduce, "", C.machine_note(info)])


if __name__ == "__main__":
    main()
