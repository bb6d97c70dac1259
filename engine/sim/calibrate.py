"""What a real run's processes spend on this machine, beyond the gradient and the update:
measured on short real runs, so that the simulator charges what a local run spends.

A local run's worker spends CPU on more than its gradient: framing, sending and receiving its
pushes and pulls (the kernel copies them through loopback), building and reporting its rows; its
shard server on receiving, checking and answering frames; the coordinator and the launcher's
recorder on every row reported. On a machine whose cores the run's processes share, that CPU
competes with the gradients, and the simulator charges it (``engine.sim.cpu``).

Three real runs on the local backend measure it: one worker and one shard server on the run's
transport, asynchronous, the bundled digits set, with an MLP of about a million keys, one of a
thousand, and the small one again over two shard servers. Each process's CPU time (user and
system, every thread, from ``/proc`` by psutil) is read through the runs, and taken over the
training window (first iteration to last). Per iteration, with the gradient and the update
(timed alone, here) left out:

- per byte: the large run's CPU less the small one's, over the bytes a worker pushes and pulls
  (a worker's and a server's, each), split evenly between sending and receiving;
- per message: a second server doubles a worker's messages (a push and a pull to each shard,
  with their ACK and values) and leaves each server's the same: the worker's extra CPU over its
  four extra messages (where that difference is lost in a busy machine's noise, a server's
  per-message cost stands for it, and one end's per-byte cost for the other's); a server's
  per-iteration CPU of the small run over its four;
- per iteration: what is left of the worker's (building and reporting its row), and the
  coordinator's and the recorder's, per row recorded.

Contention: processes that each do a worker's step, a gradient (the digits set's 3 x 512 MLP)
and its frames' copies (its 2.25 MB pushed and pulled), as many as the machine's cores, then three
times as many, for three seconds each; each one's median CPU time per step (the copies evict the
gradient's working set from the caches a crowded core shares: alone, each contends far less),
alternated and twice each. A second of work costs ``1 + contention x (busy / cores - 1)``
seconds of CPU when more processes than cores are busy, so ``contention`` is the crowded median
over the uncrowded one, less one, over two.

Run as ``python -m engine.sim.calibrate --transport tcp``: it prints the costs as JSON;
``engine.sim.costs`` runs it once (about 40 seconds) and caches the result.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

LARGE_HIDDEN = (1536, 512)  # digits' 64 inputs: 0.9 M keys, a 3.7 MB frame
SMALL_HIDDEN = (16,)  # 1,210 keys
EPOCHS = {"large": 20, "small": 40}  # about 500 and 1,000 iterations of batch 64
SAMPLE_S = 0.05
WARMUP_STEPS = 5
CONTENTION_S, SETTLE_S = 3.0, 2.0


@dataclass
class Measured:
    iterations: int
    keys: int
    cpu: dict[str, float]  # role -> CPU seconds in the training window


def _config(transport: str, hidden: tuple[int, ...], servers: int, epochs: int) -> Any:
    from engine.config import RunConfig

    return RunConfig.model_validate({
        "name": "psctl-sim-calibration",
        "cluster": {"workers": 1, "servers": servers, "transport": transport},
        "sync": {"model": "asp"}, "data": {"dataset": "digits"},
        "model": {"hidden": list(hidden)}, "train": {"epochs": epochs},
        "eval": {"interval_s": 1e6}})


class _Sampler:
    """Every role process's CPU seconds, sampled on a thread: (time, {role: cpu})."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            sampling = time.thread_time()  # this thread's own, left out of the launcher's
            now, seen = time.time(), {}
            for process in me.children(recursive=True):
                try:
                    role = _role(process.cmdline())
                    if role is not None:
                        times = process.cpu_times()
                        seen[role] = times.user + times.system
                except psutil.Error:
                    continue
            times = me.cpu_times()  # the launcher, whose recorder writes every row
            seen["launcher"] = times.user + times.system - sampling
            self.samples.append((now, seen))
            self._stop.wait(SAMPLE_S)

    def used(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per role between ``start`` and ``end`` (interpolated between samples)."""
        self._stop.set()
        self._thread.join()
        roles = set.intersection(*(set(seen) for at, seen in self.samples if start <= at <= end))
        return {role: self._at(role, end) - self._at(role, start) for role in roles}

    def _at(self, role: str, when: float) -> float:
        points = [(at, seen[role]) for at, seen in self.samples if role in seen]
        times = [at for at, _ in points]
        return float(np.interp(when, times, [cpu for _, cpu in points]))


def _role(cmdline: list[str]) -> str | None:
    """``worker 0``, ``server 1``, ``coordinator``... of a role process's command line."""
    if "engine.roles" not in cmdline or "template" in " ".join(cmdline):
        return None
    role = cmdline[cmdline.index("engine.roles") + 1]
    if "--rank" in cmdline and role in ("worker", "server"):
        return f"{role} {cmdline[cmdline.index('--rank') + 1]}"
    return role


def _run(config: Any, folder: Path) -> Measured:
    """One real run, its processes' CPU over its training window."""
    from engine.launcher import Launcher

    db = folder / f"calibration-{len(list(folder.iterdir()))}.db"
    launcher = Launcher(config, db=db, logs_root=folder / "logs")
    sampler = _Sampler()
    launcher.start()
    result = launcher.wait()
    if result.status.value != "finished":
        raise RuntimeError(f"a calibration run ended {result.status.value}: {result.reason}")
    start, end, iterations = _window(db, result.run_id)
    keys = sum(int(np.prod(shape)) for shape in _shapes(config))
    return Measured(iterations, keys, sampler.used(start, end))


def _window(db: Path, run_id: str) -> tuple[float, float, int]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT MIN(started_at), MAX(ended_at), COUNT(*) FROM iterations "
                           "WHERE run_id = ?", (run_id,)).fetchone()
    return float(row[0]), float(row[1]), int(row[2])


def _shapes(config: Any) -> list[tuple[int, ...]]:
    sizes = [64, *config.model.hidden, 10]
    return [shape for a, b in itertools.pairwise(sizes) for shape in ((b, a), (b,))]


def _alone(config: Any) -> tuple[float, float]:
    """(the gradient of a batch, the server's update per key), timed here, alone."""
    import torch

    from engine.consistency.base import ASP
    from engine.datasets import load_dataset
    from engine.keys import KeyRange
    from engine.models.flat import FlatModel
    from engine.server.optimizers import make_optimizer
    from engine.server.shard import ShardState
    from engine.sim.costs import median_cpu_time

    torch.set_num_threads(config.train.torch_threads)
    data = load_dataset("digits", None)
    model = FlatModel.for_run(config.model, data.spec, seed=0)
    x, y = data.train_x[:config.train.batch_size], data.train_y[:config.train.batch_size]
    gradient = median_cpu_time(lambda: model.step(x, y))
    keys = KeyRange(0, model.num_keys)
    state = ShardState(keys, ASP(1), make_optimizer(config.optimizer, len(keys)))
    state.init(keys, np.zeros(len(keys), dtype=np.float32))
    grad = np.full(len(keys), 1e-6, dtype=np.float32)
    clocks = iter(range(10**6))
    update = median_cpu_time(lambda: state.push(0, next(clocks), keys, grad)) / len(keys)
    return gradient, update


def _stepping(go: Any, stop: Any, times: Any) -> None:
    """A contention process: a worker's steps until ``stop`` (a gradient, then its frame copied
    out and in, as sending and receiving it do), its median CPU time into ``times``."""
    import torch

    from engine.config import ModelConfig
    from engine.datasets import load_dataset
    from engine.models.flat import FlatModel

    torch.set_num_threads(1)
    data = load_dataset("digits", None)
    model = FlatModel.for_run(ModelConfig(), data.spec, seed=0)
    x, y = data.train_x[:64], data.train_y[:64]
    frame, wire = np.empty_like(model.grads_np), np.empty_like(model.grads_np)

    def step() -> None:  # a push framed and sent, a pull received and filled in: 3 copies
        model.step(x, y)
        np.copyto(frame, model.grads_np)
        np.copyto(wire, frame)
        np.copyto(model.params_np, wire)

    for _ in range(WARMUP_STEPS):
        step()
    go.wait()
    steps: list[float] = []
    while not stop.is_set() and len(steps) < 10_000:
        began = time.thread_time()
        step()
        steps.append(time.thread_time() - began)
    times.put(statistics.median(steps))


def contention(cores: int, seconds: float = CONTENTION_S) -> float:
    """How much more CPU a step takes per busy process per core beyond one (the module's
    doc); measured in processes forked before this one starts any thread."""
    import multiprocessing

    context = multiprocessing.get_context("fork")

    def median_with(count: int) -> float:
        go, stop, times = context.Event(), context.Event(), context.Queue()
        processes = [context.Process(target=_stepping, args=(go, stop, times))
                     for _ in range(count)]
        for process in processes:
            process.start()
        try:
            time.sleep(SETTLE_S)  # their imports and warm-up, before the clock counts
            go.set()
            time.sleep(seconds)
            stop.set()
            return statistics.mean(float(times.get(timeout=60)) for _ in processes)
        finally:
            for process in processes:
                process.join(30)
                if process.is_alive():
                    process.kill()

    # Alternated, twice: the machine's own drift falls on both.
    runs = [median_with(count) for count in (cores, 3 * cores, cores, 3 * cores)]
    alone, crowded = statistics.mean(runs[0::2]), statistics.mean(runs[1::2])
    return max(crowded / alone - 1.0, 0.0) / 2


def measure(transport: str) -> dict[str, float]:
    """The costs (see the module's doc), as the fields of ``engine.sim.costs.Overheads``."""
    from engine.proctime import usable_cores

    crowding = contention(usable_cores())
    runs = {"large": _config(transport, LARGE_HIDDEN, 1, EPOCHS["large"]),
            "small": _config(transport, SMALL_HIDDEN, 1, EPOCHS["small"]),
            "two": _config(transport, SMALL_HIDDEN, 2, EPOCHS["small"])}
    with tempfile.TemporaryDirectory(prefix="psctl-calibration-") as folder:
        measured = {name: _run(config, Path(folder)) for name, config in runs.items()}
    alone = {name: _alone(config) for name, config in runs.items() if name != "two"}
    return derive(measured, alone) | {"contention": crowding}


def derive(measured: dict[str, Measured],
           alone: dict[str, tuple[float, float]]) -> dict[str, float]:
    """The costs from the three runs' CPU (``measured``: "large", "small", "two") and the
    gradient and update per key timed alone (``alone``: "large", "small")."""
    def per_iteration(name: str, role: str) -> float:
        one = measured[name]
        gradient, update = alone["small" if name == "two" else name]
        cpu = sum(v for r, v in one.cpu.items() if r.startswith(role)) / one.iterations
        return cpu - (gradient if role == "worker" else update * one.keys)

    frame = {name: 4 * m.keys for name, m in measured.items()}  # bytes each way per iteration
    grown = frame["large"] - frame["small"]
    worker_byte = (per_iteration("large", "worker") - per_iteration("small", "worker")) / grown
    server_byte = (per_iteration("large", "server") - per_iteration("small", "server")) / grown
    # Two servers: twice the worker's messages, each server's the same.
    worker_message = (per_iteration("two", "worker") - per_iteration("small", "worker")) / 4
    server_message = (per_iteration("small", "server") - server_byte * frame["small"]) / 4
    # The same for a byte: each end copies it once through the kernel and once in Python.
    if server_byte <= 0 < worker_byte:
        server_byte = worker_byte
    elif worker_byte <= 0 < server_byte:
        worker_byte = server_byte
    if worker_message <= 0:
        # A difference of two runs' CPU lost in a busy machine's noise (seen on a loaded
        # 2-core CI box) says nothing; a worker's message is then what a server's costs
        # (each end frames, copies and makes the same system calls).
        worker_message = server_message
    loop = (per_iteration("small", "worker") - 4 * worker_message
            - worker_byte * frame["small"])
    small = measured["small"]
    recorded = small.cpu.get("coordinator", 0.0) + small.cpu.get("launcher", 0.0)
    return {
        "worker_message_s": max(worker_message, 0.0),
        "server_message_s": max(server_message, 0.0),
        "worker_send_byte_s": max(worker_byte, 0.0) / 2,
        "worker_recv_byte_s": max(worker_byte, 0.0) / 2,
        "server_recv_byte_s": max(server_byte, 0.0) / 2,
        "server_send_byte_s": max(server_byte, 0.0) / 2,
        "worker_iteration_s": max(loop, 0.0),
        "row_s": recorded / small.iterations,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--transport", default="tcp")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.transport)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
