"""The server's update alone: one dense push of the whole MNIST MLP into a shard, before and after.

Every sample times ``ShardState.push`` (the same call a shard server makes for a PUSH frame: the
gradient's norm check, the aggregator, the optimizer, the finiteness guarantee, the version
counts) on one 932,362-key shard with the MLP's 9 clock ranges, ASP, 1 worker, the default
optimizer (SGD, lr 0.1, momentum 0.9). No sockets: what is timed is the update.

BLAS (numpy's and scipy's OpenBLAS) runs on one thread, as in a launched server, whose
environment has ``OMP_NUM_THREADS`` = ``train.torch_threads`` (default 1); the last variant
shows what a second thread would be worth.

- *before*: the update as it was before issue 20: numpy's four passes (``buf *= m; buf += g;
  s = lr * buf; p -= s``), with a copy of the parameters and of the momentum taken before it and
  both checked with ``np.isfinite`` after it (``SGD(fused=False)`` and the shard's checked path).
- *after*: the default: three in-place BLAS passes (``scal``, ``axpy``, ``axpy``), and no copies:
  a bound on the step from L2 norms proves it finite (``engine/server/shard.py``): the
  gradient's (measured already, to refuse a non-finite push), the parameters' and the
  momentum's.
- *after, BLAS on 2 threads*: the same with OpenBLAS's default here (a thread per core).

Components, timed alone in the same rounds: the kernel (numpy's four passes against the BLAS
three) and the guarantee (two copies and two checks against two norms).

Samples: the mean over ``--pushes`` pushes; variants alternate within a round, in reversed
order every other round; the ratio is the median of the per-round ratios after / before.
Run: ``python bench/update.py`` (about 20 s) or ``--quick`` (docs untouched).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from threadpoolctl import threadpool_limits

from bench import _common as C
from engine.consistency.base import ASP
from engine.keys import KeyRange
from engine.models.spec import MLPSpec
from engine.server import kernels
from engine.server.optimizers import SGD
from engine.server.shard import ShardState
from engine.server.update import Update

NAME = "update"
SECTION = "Server update alone (bench/update.py)"
LR, MOMENTUM = 0.1, 0.9
GOAL = "after / before <= 0.5"


class _CheckedShard(ShardState):
    """The shard as before issue 20: every step copied and checked."""

    def _bounded(self, update: Update, scale: float) -> bool:
        return False


def make_shard(fused: bool) -> ShardState:
    keys = KeyRange(0, C.num_model_keys())
    ranges = MLPSpec(C.INPUT_DIM, C.HIDDEN, C.CLASSES).layout().clock_ranges(keys)
    kind = ShardState if fused else _CheckedShard
    state = kind(keys, ASP(1), SGD(len(keys), lr=LR, momentum=MOMENTUM,
                                                       fused=fused), ranges=ranges)
    state.init(keys, np.random.default_rng(0).standard_normal(len(keys)).astype(np.float32))
    return state


def push_timer(fused: bool, grad: np.ndarray) -> Callable[[int], float]:
    state, clock = make_shard(fused), 0

    def timed(count: int) -> float:
        nonlocal clock
        started = time.perf_counter()
        for _ in range(count):
            state.push(0, clock, state.keys, grad)
            clock += 1
        return (time.perf_counter() - started) / count

    return timed


def single_thread(timer: Callable[[int], float]) -> Callable[[int], float]:
    def timed(count: int) -> float:
        with threadpool_limits(limits=1, user_api="blas"):
            return timer(count)
    return timed


def component_timers(grad: np.ndarray) -> dict[str, Callable[[int], float]]:
    size = len(grad)
    params, buf = np.ones(size, np.float32), np.zeros(size, np.float32)
    scratch = [np.empty(size, np.float32) for _ in range(2)]
    lr, m = np.float32(LR), np.float32(MOMENTUM)

    def numpy_kernel() -> None:
        buf.__imul__(m)
        buf.__iadd__(grad)
        params.__isub__(np.multiply(buf, lr, out=scratch[0]))

    def blas_kernel() -> None:
        kernels.scal(MOMENTUM, buf)
        kernels.axpy(grad, buf, 1.0)
        kernels.axpy(buf, params, -LR)

    def copies_and_checks() -> None:
        np.copyto(scratch[0], params)
        np.copyto(scratch[1], buf)
        assert np.isfinite(params).all() and np.isfinite(buf).all()

    def norms() -> None:
        assert np.isfinite(kernels.norm(params) + kernels.norm(buf))  # the gradient's is known

    return {name: _repeat(fn) for name, fn in (
        ("kernel: numpy, 4 passes", numpy_kernel), ("kernel: BLAS, 3 passes", blas_kernel),
        ("guarantee: 2 copies + 2 isfinite", copies_and_checks),
        ("guarantee: 2 norms (parameters, momentum)", norms))}


def _repeat(fn: Callable[[], None]) -> Callable[[int], float]:
    def timed(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - started) / count
    return timed


def measure(timers: dict[str, Callable[[int], float]], rounds: int,
            pushes: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for timer in timers.values():
        timer(max(2, pushes // 10))  # warm-up: first-touch page faults, BLAS threads
    names = list(timers)
    for number in range(rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            samples[name].append(timers[name](pushes) * 1e3)
    return samples


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--pushes", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds, pushes = (3, 10) if args.quick else (args.rounds, args.pushes)
    info = C.machine_info()
    grad = (np.random.default_rng(1).standard_normal(C.num_model_keys()) * 1e-3).astype(
        np.float32)
    timers = {"before": single_thread(push_timer(False, grad)),
              "after": single_thread(push_timer(True, grad)),
              "after, BLAS on 2 threads": push_timer(True, grad),
              **{name: single_thread(timer) for name, timer in component_timers(grad).items()}}
    samples = measure(timers, rounds, pushes)
    ratios = {name: C.median(C.paired_ratios(samples[name], samples["before"]))
              for name in ("after", "after, BLAS on 2 threads")}
    payload = {"benchmark": NAME, "machine": info,
               "parameters": {"keys": len(grad), "optimizer": f"sgd lr {LR} momentum {MOMENTUM}",
                              "rounds": rounds, "pushes_per_sample": pushes, "quick": args.quick,
                              "goal": GOAL},
               "samples_ms": samples,
               "medians_ms": {name: C.median(values) for name, values in samples.items()},
               "ratios_to_before": ratios, "goal_met": ratios["after"] <= 0.5}
    out = args.out or C.RESULTS / f"{NAME}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    body = docs_body(payload)
    print(body)
    if not args.quick:
        C.update_docs_section(SECTION, body)
    return payload


def docs_body(payload: dict[str, Any]) -> str:
    medians, ratios = payload["medians_ms"], payload["ratios_to_before"]
    rows = ["| measured | ms per push (median) | ratio to before (median of rounds) | goal "
            "| met? |", "|---|---|---|---|---|",
            f"| before: numpy step, copies and checks | {medians['before']:.3f} | 1 | | |"]
    for name in ("after", "after, BLAS on 2 threads"):
        met = "yes" if ratios[name] <= 0.5 else "no"
        goal = "<= 0.5" if name == "after" else ""
        rows.append(f"| {name} | {medians[name]:.3f} | {ratios[name]:.2f} | {goal} | "
                    f"{met if goal else 'n/a'} |")
    parts = ["| component | ms (median) |", "|---|---|"] + [
        f"| {name} | {medians[name]:.3f} |" for name in medians if ":" in name]
    params = payload["parameters"]
    return "\n".join([
        C.paragraph(f"One dense push of the whole MNIST MLP ({params['keys']:,} keys) into one "
                    "shard (`ShardState.push`, ASP, 1 worker, the MLP's 9 clock ranges, "
                    f"{params['optimizer']}), {params['rounds']} rounds of "
                    f"{params['pushes_per_sample']} pushes per variant, alternating. *before*: "
                    "numpy's four passes, with the parameters and the momentum copied before the "
                    "step and checked with `np.isfinite` after it (the code before issue 20). "
                    "*after*: three in-place BLAS passes, and no copies: a bound from the L2 "
                    "norms of the gradient (measured already by the push's check), the "
                    "parameters and the momentum proves the step finite. Near overflow (no "
                    "such bound) the shard still copies and checks. BLAS runs on one thread "
                    "except in the last row, as in a launched server (`OMP_NUM_THREADS` = "
                    "`train.torch_threads`, default 1). Components: one thread, timed alone in "
                    "the same rounds."), "", *rows, "", *parts, "",
        "Reproduce: `python bench/update.py` (about 20 s). Raw samples: "
        "`bench/results/update.json`.", "", C.machine_note(payload["machine"])])


if __name__ == "__main__":
    C.reexec_with_malloc_env()  # a psctl server runs with them (engine.launcher)
    main()
