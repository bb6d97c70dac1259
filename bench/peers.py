"""psctl against its nearest peer on one machine: torch DistributedDataParallel (gloo).

Both train the same MLP (hidden 512, 512, 512, the same initial values from seed 0), on the same
data (each worker the shard ``engine.worker.loops.shard_for`` gives it, in the same batches of
64), with the same update rule: SGD with lr 0.1 and momentum 0.9 on the mean of the workers'
gradients. DDP all-reduces that mean on the workers; psctl BSP averages a round's pushes on its
shard servers. Each worker is its own process with one torch thread.

Measured per run, from the start of training (after start-up and data loading):
- samples/s: every worker's samples over the training time;
- time to the target accuracy (97 % on MNIST's test set): the training time at the first
  evaluation at or above it.

Both evaluate the whole test set about every ``--eval-interval`` seconds of training, and both
pay for it: DDP's rank 0 evaluates between two iterations while the other ranks wait for it (it
checks the time every 5 iterations); psctl's evaluator is a process of its own that pulls the
parameters and evaluates while the workers go on (its CPU time competes with theirs).

psctl runs ``psctl launch --sync bsp`` (the throughput goal), and the other configurations named
by ``--psctl`` (any sync model and communication settings: the time-to-accuracy goal takes the
best). Systems alternate within a pass and passes alternate their order.

Run: ``python bench/peers.py`` (about 10 minutes). Writes ``bench/results/peers.json`` and the
section of docs/benchmarks.md. ``--quick`` is the smoke version (digits, 2 workers, one pass).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C

NAME = "peers"
SECTION = "psctl against torch DDP (bench/peers.py)"
THROUGHPUT_GOAL = 0.85
CHECK_EVERY = 5  # DDP iterations between rank 0's word on evaluating and stopping
SEED, BATCH, LR, MOMENTUM = 0, 64, 0.1, 0.9
# Name -> extra `psctl launch` flags. `bsp` is the throughput goal's; all compete for time.
PSCTL_CONFIGS: dict[str, tuple[str, ...]] = {
    "bsp": ("--sync", "bsp"),
    "asp": ("--sync", "asp"),
    "bsp, float16 wire": ("--sync", "bsp", "--wire-dtype", "float16"),
    "bsp, wait-free": ("--sync", "bsp", "--loop", "wait-free"),
    "bsp, websocket": ("--sync", "bsp", "--transport", "websocket"),
}


# -- DDP ---------------------------------------------------------------------------------------


def ddp_child(args: argparse.Namespace) -> None:
    """One DDP rank: train until rank 0 sees the target (or the time is up); rank 0 writes the
    outcome to ``args.out``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from engine.datasets import load_dataset
    from engine.models.build import build_module
    from engine.worker.loops import shard_for

    torch.set_num_threads(1)
    # The rendezvous store listens in the parent (ddp_run) from before any rank starts: a port
    # picked free and bound later by rank 0 could be taken meanwhile by a process beside it.
    store = dist.TCPStore("127.0.0.1", args.port, args.world, is_master=False,
                          timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=120))
    try:
        data = load_dataset(args.dataset, Path(args.data_dir) if args.data_dir else None,
                            allow_download=False)
        module = build_module("mlp", C.HIDDEN, data.spec.sample_shape, data.spec.num_classes,
                              seed=SEED)
        model = DistributedDataParallel(module)
        optimizer = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)
        shard = shard_for(data.train_x, data.train_y, rank=args.rank, workers=args.world,
                          seed=SEED, batch_size=BATCH)
        test = (torch.from_numpy(data.test_x), torch.from_numpy(data.test_y))
        dist.barrier()
        outcome = _ddp_train(args, model, module, optimizer, shard, test)
        if args.rank == 0:
            Path(args.out).write_text(json.dumps(outcome))
        # Every rank done with its last collective before any tears its connections down: a
        # rank whose gloo peer closed first can die in std::terminate (seen once in CI).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _ddp_train(args: argparse.Namespace, model: Any, module: Any, optimizer: Any, shard: Any,
               test: tuple[Any, Any]) -> dict[str, Any]:
    """Train; every ``CHECK_EVERY`` iterations rank 0 evaluates if ``eval_interval`` seconds
    have passed since its last evaluation, and tells every rank whether to stop."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn

    from engine.models.flat import evaluate

    started, samples, iterations, last_eval = time.perf_counter(), 0, 0, 0.0
    evaluations: list[tuple[float, float]] = []
    stop = torch.zeros(1)
    for epoch in range(10_000):
        rng = np.random.default_rng([SEED, args.rank, epoch])
        for batch in shard.batches(rng):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.from_numpy(shard.inputs[batch])),
                                               torch.from_numpy(shard.targets[batch]))
            loss.backward()
            optimizer.step()
            iterations += 1
            samples += len(batch)
            if iterations % CHECK_EVERY:
                continue
            if args.rank == 0 and time.perf_counter() - started - last_eval >= args.eval_interval:
                accuracy = evaluate(module, *test)[0]
                last_eval = time.perf_counter() - started
                evaluations.append((last_eval, accuracy))
                stop[0] = float(accuracy >= args.target or last_eval >= args.max_seconds)
            dist.broadcast(stop, 0)
            if stop[0]:
                trained_s = time.perf_counter() - started
                reached = next((s for s, a in evaluations if a >= args.target), None)
                return {"training_s": trained_s, "samples": samples * args.world,
                        "to_target_s": reached, "evaluations": evaluations,
                        "iterations": iterations}
    raise RuntimeError("DDP ran out of epochs before its target or time limit")


def ddp_run(workers: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """A DDP run of ``workers`` processes; its outcome, with samples/s."""
    import torch.distributed as dist

    out = scratch / f"ddp-{time.monotonic_ns()}.json"
    store = dist.TCPStore("127.0.0.1", 0, workers, is_master=True, wait_for_workers=False)
    common = ["--port", str(store.port), "--world", str(workers), "--out", str(out), "--dataset",
              args.dataset, "--data-dir", args.data_dir or "", "--target", str(args.target),
              "--max-seconds", str(args.max_seconds), "--eval-interval",
              str(args.eval_interval)]
    env = dict(C.child_env(), OMP_NUM_THREADS="1")
    started = time.perf_counter()
    children = [subprocess.Popen([sys.executable, __file__, "--ddp-child", "--rank", str(rank),
                                  *common], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True) for rank in range(workers)]
    try:
        errors = [child.communicate(timeout=args.max_seconds + 300)[1] for child in children]
    finally:
        for child in children:  # only on a timeout or an error are any left
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
    if any(child.returncode for child in children):
        raise RuntimeError("a DDP rank failed:\n" + "\n".join(e[-1500:] for e in errors if e))
    outcome = json.loads(out.read_text())
    outcome["wall_s"] = time.perf_counter() - started
    outcome["samples_per_s"] = outcome["samples"] / outcome["training_s"]
    return outcome


# -- psctl -------------------------------------------------------------------------------------


def psctl_run(workers: int, flags: tuple[str, ...], args: argparse.Namespace,
              scratch: Path) -> dict[str, Any]:
    """One `psctl launch`; its outcome from the run's database, with samples/s."""
    db = scratch / f"psctl-{time.monotonic_ns()}.db"
    command = [sys.executable, "-m", "psctl", "launch", "--workers", str(workers), "--servers",
               str(args.servers), "--dataset", args.dataset, "--batch-size", str(BATCH), "--lr",
               str(LR), "--momentum", str(MOMENTUM), "--seed", str(SEED), "--target-accuracy",
               str(args.target), "--max-seconds", str(args.max_seconds), "--eval-interval",
               str(args.eval_interval), "--no-live", *flags]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=C.REPO, env=env, capture_output=True, text=True,
                          timeout=args.max_seconds + 300, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"psctl launch failed:\n{done.stderr[-2000:]}")
    run_id = C.query_db(db, "SELECT id FROM runs")[0][0]
    began = C.training_outcome(db, run_id)["training_started"]
    ended, samples, iterations = C.query_db(
        db, "SELECT max(ended_at), sum(samples), count(*) FROM iterations WHERE run_id = ?",
        run_id)[0]
    rows = C.query_db(db, "SELECT at, accuracy FROM evaluations WHERE run_id = ? ORDER BY at",
                      run_id)
    evaluations = [(at - began, accuracy) for at, accuracy in rows]
    reached = next((s for s, a in evaluations if a >= args.target), None)
    return {"training_s": ended - began, "samples": samples, "to_target_s": reached,
            "evaluations": evaluations, "iterations": iterations, "wall_s": wall,
            "samples_per_s": samples / (ended - began)}


# -- the benchmark -----------------------------------------------------------------------------


def one_pass(workers: int, systems: list[str], args: argparse.Namespace,
             scratch: Path) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for system in systems:
        runs[system] = (ddp_run(workers, args, scratch) if system == "ddp" else
                        psctl_run(workers, PSCTL_CONFIGS[system.removeprefix("psctl ")], args,
                                  scratch))
        print(f"workers={workers} {system}: {_brief(runs[system])}", file=sys.stderr)
    return runs


def _brief(run: dict[str, Any]) -> str:
    to = run["to_target_s"]
    return (f"{run['samples_per_s']:.0f} samples/s, to target "
            f"{'not reached' if to is None else f'{to:.1f} s'}, trained {run['training_s']:.1f} s")


def summarise(passes: list[dict[str, Any]], systems: list[str],
              workers: list[int]) -> dict[str, Any]:
    """Per worker count: each system's median samples/s and time to target, and psctl's ratios
    to DDP (throughput: psctl / DDP; time: psctl / DDP, per pass, then the median)."""
    summary: dict[str, Any] = {}
    for count in workers:
        runs = [one["runs"][str(count)] for one in passes]
        row: dict[str, Any] = {}
        for system in systems:
            rates = [r[system]["samples_per_s"] for r in runs]
            times = [r[system]["to_target_s"] for r in runs]
            row[system] = {"samples_per_s": C.median(rates),
                           "to_target_s": C.median(times) if None not in times else None}
            if system != "ddp":
                row[system]["throughput_ratio"] = C.median(
                    C.paired_ratios(rates, [r["ddp"]["samples_per_s"] for r in runs]))
        summary[str(count)] = row
    return summary


def verdicts(summary: dict[str, Any]) -> dict[str, Any]:
    """The two goals per worker count: BSP throughput >= 0.85x DDP's, and psctl's fastest
    configuration at the target no later than DDP."""
    out: dict[str, Any] = {}
    for count, row in summary.items():
        psctl = {name: value for name, value in row.items() if name != "ddp"}
        timed = {n: v["to_target_s"] for n, v in psctl.items() if v["to_target_s"] is not None}
        best = min(timed, key=lambda name: timed[name]) if timed else None
        ddp_time = row["ddp"]["to_target_s"]
        out[count] = {
            "bsp_throughput_ratio": psctl["psctl bsp"]["throughput_ratio"],
            "throughput_met": psctl["psctl bsp"]["throughput_ratio"] >= THROUGHPUT_GOAL,
            "fastest_psctl": best,
            "time_met": bool(best and ddp_time is not None and timed[best] <= ddp_time),
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    C.add_pass_arguments(parser, NAME)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--psctl", action="append", choices=sorted(PSCTL_CONFIGS), default=None,
                        help="psctl configurations to run [all]; bsp always runs")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--data-dir", default=str(C.REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--max-seconds", type=float, default=240.0)
    parser.add_argument("--eval-interval", type=float, default=1.0,
                        help="both: evaluate the whole test set every S seconds of training")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--redraw", action="store_true",
                        help=f"rewrite the docs section from bench/results/{NAME}.json (runs "
                             "nothing)")
    args = parser.parse_args(argv)
    if args.redraw:
        payload = json.loads((C.RESULTS / f"{NAME}.json").read_text())
        C.update_docs_section(SECTION, docs_body(payload))
        return dict(payload)
    if args.quick:
        args.passes, args.workers, args.psctl = 1, [2], ["bsp"]
        args.dataset, args.data_dir, args.target, args.max_seconds = "digits", "", 0.8, 60.0
        args.eval_interval = 0.3
    configs = sorted({"bsp", *(args.psctl or PSCTL_CONFIGS)}, key=list(PSCTL_CONFIGS).index)
    systems = ["ddp", *(f"psctl {name}" for name in configs)]
    passes: list[dict[str, Any]] = C.earlier_passes(NAME) if args.append else []
    with tempfile.TemporaryDirectory(prefix="psctl-peers-") as scratch_name:
        for index in range(args.passes):
            forward = (index % 2 == 0) == (args.order == "forward")
            order = systems if forward else systems[::-1]
            info = C.machine_info()
            passes.append({"order": "forward" if forward else "reverse", "machine": info,
                           "runs": {str(count): one_pass(count, order, args, Path(scratch_name))
                                    for count in args.workers}})
    summary = summarise(passes, systems, args.workers)
    payload = {"benchmark": NAME, "settings": {k: v for k, v in vars(args).items()
                                               if k != "out" and k != "db"},
               "psctl_configs": {name: list(PSCTL_CONFIGS[name]) for name in configs},
               "passes": passes, "summary": summary, "verdicts": verdicts(summary)}
    if args.out is not None:
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        return payload
    C.write_result(NAME, payload)
    body = docs_body(payload)
    print(body)
    if not args.quick:
        C.update_docs_section(SECTION, body)
    return payload


def docs_body(payload: dict[str, Any]) -> str:
    settings = payload["settings"]
    rows = ["| workers | system | samples/s | / DDP | to 97 % (s) |", "|---|---|---|---|---|"]
    for count, row in payload["summary"].items():
        for system, value in row.items():
            ratio = value.get("throughput_ratio")
            to = value["to_target_s"]
            rows.append(f"| {count} | {system} | {value['samples_per_s']:.0f} | "
                        f"{'' if ratio is None else C.fmt_ratio(ratio)} | "
                        f"{'not reached' if to is None else f'{to:.1f}'} |")
    lines = [
        C.paragraph("The same MLP, data, batches (64 per worker) and update rule (SGD lr 0.1, "
                    "momentum 0.9, on the workers' mean gradient), torch DistributedDataParallel "
                    f"(gloo) against `psctl launch` with {settings['servers']} shard servers; "
                    "each worker a process with one torch thread. Medians of "
                    f"{len(payload['passes'])} alternating passes; time from the start of "
                    "training. Both evaluate the test set every "
                    f"{settings['eval_interval']:g} s and count it: DDP's rank 0 between two "
                    "iterations, psctl's evaluator beside the workers."),
        "", *rows, ""]
    for count, verdict in payload["verdicts"].items():
        lines.append(C.paragraph(
            f"{count} workers: psctl BSP throughput {C.fmt_ratio(verdict['bsp_throughput_ratio'])}"
            f" of DDP's (goal >= {THROUGHPUT_GOAL}: "
            f"{'met' if verdict['throughput_met'] else 'not met'}); fastest psctl configuration "
            f"to 97 %: {verdict['fastest_psctl'] or 'none reached it'} (goal: no later than "
            f"DDP: {'met' if verdict['time_met'] else 'not met'})."))
        lines.append("")
    lines += [*_findings(payload["summary"]), "",
              "Reproduce: `python bench/peers.py` (about 15 minutes). Raw results: "
              "`bench/results/peers.json`.", "", C.machine_note(payload["passes"][0]["machine"])]
    return "\n".join(lines)


def _findings(summary: dict[str, Any]) -> list[str]:
    """What the table says about the configurations beside plain BSP, in numbers, and the
    explanations that those numbers bear out (none is written for a pass that did not run)."""
    lines, ratios = [], {}
    for count, row in summary.items():
        bsp = row["psctl bsp"]["samples_per_s"]
        mine = {name.removeprefix("psctl "): value["samples_per_s"] / bsp
                for name, value in row.items() if name not in ("ddp", "psctl bsp")}
        ratios[int(count)] = mine
        if mine:
            lines.append(f"{count} workers, samples/s against psctl bsp: "
                         + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in mine.items())
                         + ".")
    return [C.paragraph(" ".join(lines + _explained(ratios)))] if lines else []


def _explained(ratios: dict[int, dict[str, float]]) -> list[str]:
    """Why, where the measured ratios show it: on 2 cores every process is busy, so moving bytes
    costs CPU that computing would have used."""
    said = []
    counts = sorted(ratios)
    half = [ratios[count]["bsp, float16 wire"] for count in counts
            if "bsp, float16 wire" in ratios[count]]
    if len(counts) > 1 and len(half) == len(counts) and half[-1] > half[0] > 1:
        said.append(f"The float16 wire (half the bytes, casts by torch) helps more with "
                    f"{counts[-1]} workers than with {counts[0]}: where more bytes move, moving "
                    "them costs more of the CPU that computing would use.")
    wait_free = [ratios[count]["bsp, wait-free"] for count in counts
                 if "bsp, wait-free" in ratios[count]]
    if wait_free and max(wait_free) < 1:
        said.append("Pushing each layer from inside backward (wait-free) gains nothing here: "
                    "with every core busy it overlaps no idle time, and its 8 frames per push "
                    "cost more than one (bench/overhead.py measures the loops alone).")
    return said


def _child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddp-child", action="store_true")
    for name in ("--rank", "--world", "--port"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--eval-interval", type=float, required=True)
    for name in ("--out", "--dataset", "--data-dir"):
        parser.add_argument(name, required=True)
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--max-seconds", type=float, required=True)
    ddp_child(parser.parse_args(argv))


if __name__ == "__main__":
    if "--ddp-child" in sys.argv:
        _child_main(sys.argv[1:])
    else:
        main()
