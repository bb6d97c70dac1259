"""Server-side learning rules under asynchrony (Downpour) with one 4x straggler, on MNIST.

Each configuration trains the MNIST MLP on real server and worker processes, as ``psctl launch``
does: asp, 4 workers, 2 shard servers, batch 64, worker 3 four times slower (``--straggler
3:4x``), evaluation every 2 s, for a fixed time budget. The baseline is fixed-rate SGD with
momentum (``--optimizer sgd --lr-rule none``: Downpour with a constant rate), run in the same
pass; the others are Adagrad on the servers (DistBelief's choice) and the staleness-aware rules
consgd, dynsgd, dynssgc, adaptive and split on the same SGD. Measured per run: time to the
target accuracy from the launch, best test accuracy within the budget, mean staleness. Passes
alternate the order of the configurations, so a drift in the machine's load does not favour
the same one.

Reproduce: ``python bench/learning_rules.py [--order reverse] [--append]`` (about 12 minutes a
pass); ``--quick`` runs a tiny digits version in about five minutes (docs untouched).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

BASELINE = "SGD, fixed rate (none)"
CONFIGS: dict[str, dict[str, Any]] = {
    BASELINE: {"optimizer.name": "sgd", "learning.rule": "none"},
    "Adagrad (none)": {"optimizer.name": "adagrad", "learning.rule": "none"},
    "SGD + consgd": {"optimizer.name": "sgd", "learning.rule": "consgd"},
    "SGD + dynsgd": {"optimizer.name": "sgd", "learning.rule": "dynsgd"},
    "SGD + dynssgc": {"optimizer.name": "sgd", "learning.rule": "dynssgc"},
    "SGD + adaptive": {"optimizer.name": "sgd", "learning.rule": "adaptive"},
    "SGD + split": {"optimizer.name": "sgd", "learning.rule": "split"},
}
DOCS_TITLE = "Learning rules with a 4x straggler (MNIST, asynchronous)"


def run_config(label: str, overrides: dict[str, Any], args: argparse.Namespace,
               db: Path) -> dict[str, Any]:
    from engine.db import open_engine
    from engine.db.queries import run_detail
    from engine.launcher import Launcher
    from engine.plan import build_config

    values = {
        "cluster.workers": 4, "cluster.servers": 2, "sync.model": "asp",
        "data.dataset": args.dataset, "data.data_dir": args.data_dir, "train.epochs": 100,
        "eval.interval_s": 2.0, "stop.max_seconds": args.budget_s,
        "heterogeneity.stragglers": [{"rank": 3, "factor": 4.0}],
        "name": f"bench-{label}", **overrides}
    config = build_config({}, values)
    launcher = Launcher(config, db=db)
    launcher.start()
    result = launcher.wait()
    engine = open_engine(db, readonly=True)
    try:
        detail = run_detail(engine, launcher.run_id)
    finally:
        engine.dispose()
    points = [(e.elapsed_s, e.accuracy) for e in detail.evaluations]
    reached = next((t for t, acc in points if acc >= args.target), None)
    iterations = sum(w.iterations for w in detail.workers)
    stale = sum((w.staleness_mean or 0.0) * w.iterations for w in detail.workers)
    return {
        "config": label, "run_id": launcher.run_id, "status": result.status.value,
        "optimizer": config.optimizer.name, "lr": config.optimizer.lr,
        "rule": config.learning.rule, "time_to_target_s": reached,
        "best_accuracy": max((acc for _, acc in points), default=None),
        "final_accuracy": points[-1][1] if points else None,
        "iterations": iterations,
        "staleness_mean": stale / iterations if iterations else None,
    }


def table(rows: list[dict[str, Any]], target: float, budget_s: float) -> list[str]:
    base = next((r for r in rows if r["config"] == BASELINE), None)
    lines = [f"| configuration | lr | status | time to {target:.0%} | speedup vs fixed-rate SGD | "
             f"best accuracy in {budget_s:.0f} s | mean staleness | iterations |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        reached = row["time_to_target_s"]
        speedup = ""
        if base and base["time_to_target_s"] and reached:
            speedup = C.fmt_ratio(base["time_to_target_s"] / reached)
        best = row["best_accuracy"]
        stale = row["staleness_mean"]
        lines.append(
            f"| {row['config']} | {row['lr']:g} | {row['status']} | "
            f"{'not reached' if reached is None else f'{reached:.1f} s'} | {speedup} | "
            f"{'' if best is None else f'{best:.2%}'} | "
            f"{'' if stale is None else f'{stale:.2f}'} | {row['iterations']} |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--budget-s", type=float, default=90.0,
                        help="seconds each configuration trains")
    C.add_pass_arguments(parser, "learning_rules")
    parser.add_argument("--only", action="append", default=None,
                        help="run only this configuration (repeatable; a smoke test)")
    parser.add_argument("--redraw", action="store_true",
                        help="rewrite the docs section from bench/results/learning_rules.json "
                        "(runs nothing)")
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.target, args.budget_s, args.data_dir = 0.9, 30.0, None
    if args.redraw:
        passes = C.earlier_passes("learning_rules")
        C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(_docs_body(passes, args))))
        return {"passes": passes}
    chosen = [c for c in CONFIGS if not args.only or c in args.only]
    if args.only and len(chosen) != len(args.only):
        raise SystemExit(f"--only takes one of: {', '.join(CONFIGS)}")
    db = args.db or Path(f"/tmp/psctl-bench-learning-{int(time.time())}.db")
    labels = chosen if args.order == "forward" else list(reversed(chosen))
    info = C.machine_info()
    rows = []
    for label in labels:
        rows.append(run_config(label, CONFIGS[label], args, db))
        print(f"{label}: {rows[-1]['time_to_target_s']} s to target, best "
              f"{rows[-1]['best_accuracy']}", flush=True)
    rows.sort(key=lambda r: list(CONFIGS).index(r["config"]))
    this_pass = {"order": args.order, "machine": info, "db": str(db), "results": rows}
    print("\n".join(table(rows, args.target, args.budget_s)))
    if args.quick or args.only:
        return {"passes": [this_pass]}
    passes = [*(C.earlier_passes("learning_rules") if args.append else []), this_pass]
    payload = {"parameters": {k: v for k, v in vars(args).items()
                              if k not in ("db", "redraw")},
               "passes": passes}
    C.write_result("learning_rules", payload)
    C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(_docs_body(passes, args))))
    return payload


def _docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    body = [f"Command: `python bench/learning_rules.py [--order reverse] [--append]`; asp, 4 "
            "workers, 2 servers, worker 3 at 4x (`--straggler 3:4x`), MNIST MLP, batch 64, "
            f"evaluation every 2 s, {args.budget_s:.0f} s per configuration; each optimizer at "
            "its default learning rate (docs/learning.md), SGD with momentum 0.9. Each pass "
            "runs the configurations one after another; the order alternates between passes.",
            ""]
    body += C.pass_tables(passes, lambda one: table(one["results"], args.target, args.budget_s))
    body += [_verdict(passes, args.target), "", C.machine_note(passes[-1]["machine"])]
    return body


def _verdict(passes: list[dict[str, Any]], target: float) -> str:
    """Which configuration reached the target first in each pass (measured, not asserted)."""
    winners = []
    for one in passes:
        reached = [r for r in one["results"] if r["time_to_target_s"] is not None]
        if reached:
            best = min(reached, key=lambda r: r["time_to_target_s"])
            winners.append(f"{best['config']} ({best['time_to_target_s']:.1f} s)")
        else:
            winners.append(f"none reached {target:.0%}")
    everywhere = [c for c in CONFIGS if all(
        any(r["config"] == c and r["time_to_target_s"] is not None for r in one["results"])
        for one in passes)]
    return ("Fastest to the target, per pass: " + "; ".join(winners) + ". Reached "
            f"{target:.0%} in every pass: " + (", ".join(everywhere) or "none") + ".")


if __name__ == "__main__":
    main()
