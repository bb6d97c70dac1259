"""Wall time to a target test accuracy, per consistency model, with one straggler.

Each model trains the MNIST MLP (784-512-512-512-10) on real server and worker processes, exactly
as ``psctl launch`` does: 4 workers, 2 shard servers, batch 64, server SGD lr 0.1 momentum 0.9,
worker 3 made 3x slower (``--straggler 3:3x``), evaluation every 2 s. Every run trains for the
same number of epochs (or until its time cap); time to target = elapsed time of the first
evaluation at or above the target, from the launch (wall time) and from the first iteration
(training time, without process start-up and data loading); final accuracy = the evaluation
after training ended.

The baseline is BSP, run in the same script; the headline figure is the ratio of BSP's time to
target to each model's. Models run one after another, in the order given (``--order`` reverses
it so that a drift in the machine's load does not always favour the same model).

Reproduce: ``python bench/sync_models.py --data-dir ../shared/data/mnist`` (about 10 minutes);
``--quick`` runs a tiny digits version in about a minute (docs untouched).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "BSP": {"sync.model": "bsp"},
    "ASP": {"sync.model": "asp"},
    "SSP (S = 3)": {"sync.model": "ssp", "sync.staleness": 3},
    "DSSP (S = 3, R = 4)": {"sync.model": "dssp", "sync.staleness": 3, "sync.range": 4},
    "ElasticBSP (R = 15)": {"sync.model": "elastic", "sync.lookahead": 15},
    "ElasticBSP (R = 60)": {"sync.model": "elastic", "sync.lookahead": 60},
}


def run_model(label: str, overrides: dict[str, Any], args: argparse.Namespace,
              db: Path) -> dict[str, Any]:
    from engine.config import build_config
    from engine.db import open_engine
    from engine.db.queries import run_detail
    from engine.launcher import Launcher

    values = {
        "cluster.workers": 4, "cluster.servers": 2, "data.dataset": args.dataset,
        "data.data_dir": args.data_dir, "train.epochs": args.epochs, "eval.interval_s": 2.0,
        "stop.max_seconds": args.cap_s, "heterogeneity.stragglers": [
            {"rank": 3, "factor": 3.0}], "name": f"bench-{label}", **overrides}
    launcher = Launcher(build_config({}, values), db=db)
    started = time.monotonic()
    launcher.start()
    result = launcher.wait()
    wall = time.monotonic() - started
    engine = open_engine(db, readonly=True)
    try:
        detail = run_detail(engine, launcher.run_id)
    finally:
        engine.dispose()
    points = [(e.elapsed_s, e.accuracy) for e in detail.evaluations]
    reached = next((t for t, acc in points if acc >= args.target), None)
    # The same moment measured from the first iteration, without process start-up and data load.
    first = min((w.first_started_at for w in detail.workers), default=None)
    training = next((e.at - first for e in detail.evaluations
                     if e.accuracy >= args.target and first is not None), None)
    workers = detail.workers
    return {
        "model": label, "run_id": launcher.run_id, "status": result.status.value,
        "wall_s": wall, "time_to_target_s": reached, "training_time_to_target_s": training,
        "final_accuracy": points[-1][1] if points else None,
        "best_accuracy": max((acc for _, acc in points), default=None),
        "iterations": sum(w.iterations for w in workers),
        "idle_fraction": [w.idle_fraction for w in workers],
        "staleness_mean": [w.staleness_mean for w in workers],
    }


def table(rows: list[dict[str, Any]], target: float) -> list[str]:
    bsp = next((r for r in rows if r["model"] == "BSP"), None)
    lines = [f"| model | wall time to {target:.0%} | speedup vs BSP | training time to "
             f"{target:.0%} | speedup vs BSP | final accuracy | iterations | idle fraction "
             "(mean of workers) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        reached, training = row["time_to_target_s"], row["training_time_to_target_s"]
        speedup = _speedup(bsp, row, "time_to_target_s")
        training_speedup = _speedup(bsp, row, "training_time_to_target_s")
        idle = [f for f in row["idle_fraction"] if f is not None]
        idle_text = f"{sum(idle) / len(idle):.2f}" if idle else ""
        final = row["final_accuracy"]
        lines.append(
            f"| {row['model']} | {_seconds(reached)} | {speedup} | {_seconds(training)} | "
            f"{training_speedup} | {'' if final is None else f'{final:.2%}'} | "
            f"{row['iterations']} | {idle_text} |")
    return lines


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "not reached"


def _speedup(bsp: dict[str, Any] | None, row: dict[str, Any], key: str) -> str:
    if bsp is None or bsp[key] is None or row[key] is None:
        return ""
    return C.fmt_ratio(bsp[key] / row[key])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cap-s", type=float, default=240.0)
    parser.add_argument("--order", choices=("forward", "reverse"), default="forward")
    parser.add_argument("--append", action="store_true",
                        help="keep the earlier passes in bench/results/sync_models.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--db", type=Path, default=None)
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.target, args.epochs, args.cap_s, args.data_dir = 0.5, 3, 60.0, None
    db = args.db or Path(f"/tmp/psctl-bench-sync-{int(time.time())}.db")
    labels = list(MODELS) if args.order == "forward" else list(reversed(MODELS))
    info = C.machine_info()
    rows = []
    for label in labels:
        rows.append(run_model(label, MODELS[label], args, db))
        print(f"{label}: {rows[-1]['time_to_target_s']} s to target, final "
              f"{rows[-1]['final_accuracy']}", flush=True)
    rows.sort(key=lambda r: list(MODELS).index(r["model"]))
    this_pass = {"order": args.order, "machine": info, "db": str(db), "results": rows}
    passes = [*(_earlier_passes() if args.append else []), this_pass]
    payload = {"parameters": {k: v for k, v in vars(args).items() if k != "db"},
               "passes": passes}
    print("\n".join(table(rows, args.target)))
    if not args.quick:
        C.write_result("sync_models", payload)
        C.update_docs_section("Consistency models with a 3x straggler (MNIST)",
                              "\n".join(C.wrap_lines(_docs_body(passes, args))))
    return payload


def _waiting_bound(rows: list[dict[str, Any]]) -> str:
    """What removing every wait of BSP could gain at most, at the same statistical efficiency:
    the models here differ from BSP mostly in how long workers sit idle."""
    bsp = next((r for r in rows if r["model"] == "BSP"), None)
    idle = [f for f in (bsp or {}).get("idle_fraction", []) if f is not None]
    if not idle:
        return ""
    mean = sum(idle) / len(idle)
    return (f"BSP's workers were idle {mean:.0%} of the time here: a model that only removed the "
            f"waiting would finish at most 1 / (1 - {mean:.2f}) = {1 / (1 - mean):.2f}x sooner "
            "per iteration.")


def _earlier_passes() -> list[dict[str, Any]]:
    path = C.RESULTS / "sync_models.json"
    if not path.exists():
        return []
    return list(json.loads(path.read_text()).get("passes", []))


def _docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    body = [f"Command: `python bench/sync_models.py [--order reverse] [--append]`; 4 workers, 2 "
            "servers, worker 3 at 3x (`--straggler 3:3x`), MNIST MLP, batch 64, lr 0.1, momentum "
            f"0.9, evaluation every 2 s (so times are within 2 s), {args.epochs} epochs. Each "
            "pass runs the models one after another; the order alternates between passes.", ""]
    for number, one in enumerate(passes, start=1):
        load = one["machine"]["loadavg_at_start"][0]
        body += [f"Pass {number} ({one['order']} order, load average {load:.2f} at its start):",
                 "", *table(one["results"], args.target), "", _waiting_bound(one["results"]), ""]
    body.append(C.machine_note(passes[-1]["machine"]))
    return body


if __name__ == "__main__":
    main()
