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
import sqlite3
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
    from engine.db import open_engine
    from engine.db.queries import run_detail
    from engine.launcher import Launcher
    from engine.plan import build_config

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
    target_at = next((e.at for e in detail.evaluations if e.accuracy >= args.target), None)
    return {
        "model": label, "run_id": launcher.run_id, "status": result.status.value,
        "wall_s": wall, "time_to_target_s": reached, "training_time_to_target_s": training,
        "target_at": target_at,
        "gradients_to_target": gradients_before(db, launcher.run_id, target_at),
        "final_accuracy": points[-1][1] if points else None,
        "best_accuracy": max((acc for _, acc in points), default=None),
        "iterations": sum(w.iterations for w in workers),
        "idle_fraction": [w.idle_fraction for w in workers],
        "staleness_mean": [w.staleness_mean for w in workers],
    }


def gradients_before(db: Path, run_id: str, at: float | None) -> int | None:
    """How many worker gradients the servers had received when the target was first reached:
    BSP averages four per update, the asynchronous models apply each one (scaled by 1/workers),
    so this is the statistical cost of the target, comparable across models."""
    if at is None:
        return None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM iterations WHERE run_id = ? AND "
                                "pushed_at <= ?", (run_id, at)).fetchone()
    return int(count)


def table(rows: list[dict[str, Any]], target: float) -> list[str]:
    bsp = next((r for r in rows if r["model"] == "BSP"), None)
    lines = [f"| model | wall time to {target:.0%} | speedup vs BSP | training time to "
             f"{target:.0%} | speedup vs BSP | gradients to {target:.0%} | gradients/s until "
             "then | final accuracy | iterations | idle fraction (mean of workers) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        reached, training = row["time_to_target_s"], row["training_time_to_target_s"]
        speedup = _speedup(bsp, row, "time_to_target_s")
        training_speedup = _speedup(bsp, row, "training_time_to_target_s")
        idle = [f for f in row["idle_fraction"] if f is not None]
        idle_text = f"{sum(idle) / len(idle):.2f}" if idle else ""
        final = row["final_accuracy"]
        gradients = row.get("gradients_to_target")
        rate = f"{gradients / training:.0f}" if gradients and training else ""
        lines.append(
            f"| {row['model']} | {_seconds(reached)} | {speedup} | {_seconds(training)} | "
            f"{training_speedup} | {'' if gradients is None else gradients} | {rate} | "
            f"{'' if final is None else f'{final:.2%}'} | "
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
    C.add_pass_arguments(parser, "sync_models")
    parser.add_argument("--reanalyse", action="store_true",
                        help="recompute the derived columns of the recorded passes from their "
                        "databases, then rewrite the results and docs (runs nothing)")
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.target, args.epochs, args.cap_s, args.data_dir = 0.5, 3, 60.0, None
    if args.reanalyse:
        return _rewrite(reanalyse(C.earlier_passes("sync_models"), args.target), args)
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
    print("\n".join(table(rows, args.target)))
    if args.quick:
        return {"passes": [this_pass]}
    return _rewrite([*(C.earlier_passes("sync_models") if args.append else []), this_pass], args)


def _rewrite(passes: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    payload = {"parameters": {k: v for k, v in vars(args).items()
                              if k not in ("db", "reanalyse")}, "passes": passes}
    C.write_result("sync_models", payload)
    C.update_docs_section("Consistency models with a 3x straggler (MNIST)",
                          "\n".join(C.wrap_lines(_docs_body(passes, args))))
    return payload


def reanalyse(passes: list[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """Fill the columns added after a pass was measured, from that pass's own database."""
    for one in passes:
        db = Path(one["db"])
        for row in one["results"]:
            if "gradients_to_target" in row:
                continue
            if not db.exists():
                raise SystemExit(f"{db}: the database of this pass is gone; run the pass again")
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                found = conn.execute("SELECT min(at) FROM evaluations WHERE run_id = ? AND "
                                     "accuracy >= ?", (row["run_id"], target)).fetchone()
            row["target_at"] = found[0]
            row["gradients_to_target"] = gradients_before(db, row["run_id"], found[0])
    return passes


def _decomposition(rows: list[dict[str, Any]]) -> str:
    """Split each ElasticBSP speedup into how fast gradients arrived and how many it needed."""
    bsp = next((r for r in rows if r["model"] == "BSP"), None)
    parts = []
    for row in rows:
        if not row["model"].startswith("ElasticBSP") or bsp is None:
            continue
        needed: list[float] = [r.get("gradients_to_target") or 0.0 for r in (bsp, row)]
        spent: list[float] = [r["training_time_to_target_s"] or 0.0 for r in (bsp, row)]
        if 0.0 in needed or 0.0 in spent:
            continue
        rate = (needed[1] / spent[1]) / (needed[0] / spent[0])
        parts.append(f"{row['model']} received gradients {rate:.2f}x as fast as BSP but needed "
                     f"{needed[1] / needed[0]:.2f}x as many to reach the target")
    return "; ".join(parts) + "." if parts else ""


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


def _docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    body = [f"Command: `python bench/sync_models.py [--order reverse] [--append]`; 4 workers, 2 "
            "servers, worker 3 at 3x (`--straggler 3:3x`), MNIST MLP, batch 64, lr 0.1, momentum "
            f"0.9, evaluation every 2 s (so times are within 2 s), {args.epochs} epochs. Each "
            "pass runs the models one after another; the order alternates between passes.", ""]
    for number, one in enumerate(passes, start=1):
        load = one["machine"]["loadavg_at_start"][0]
        body += [f"Pass {number} ({one['order']} order, load average {load:.2f} at its start):",
                 "", *table(one["results"], args.target), "", _waiting_bound(one["results"]),
                 "", _decomposition(one["results"]), ""]
    body += [_verdict(passes, args.target), "", C.paragraph(WHY), "",
             C.machine_note(passes[-1]["machine"])]
    return body


# Interpretation of the measured columns above; the numbers themselves are in the tables.
WHY = """Reading the columns: ElasticBSP removes most of BSP's waiting (the idle fractions
above), but on this 2-core machine the six processes then compete for the CPU, so gradients arrive
only somewhat faster (the gradients/s column), not the 2.5x that a 3x straggler allows in
principle. And the gradients the fast workers push between barriers are applied one by one (each
scaled by 1/workers), so more of them are needed to reach the target than BSP's averaged rounds
(the gradients-to-target column). The two cancel out. Whether the gap closes where workers do not
share two cores (the paper's 1.77x is for VGG16 on a cluster) was not measured here."""


def _verdict(passes: list[dict[str, Any]], target: float) -> str:
    best = []
    for one in passes:
        bsp = next((r for r in one["results"] if r["model"] == "BSP"), None)
        for row in one["results"]:
            if row["model"].startswith("ElasticBSP") and bsp and bsp["time_to_target_s"] \
                    and row["time_to_target_s"]:
                best.append(bsp["time_to_target_s"] / row["time_to_target_s"])
    top = f"{max(best):.2f}x" if best else "none reached the target"
    met = "met" if best and max(best) >= 2.0 else "not met"
    return (f"Goal: ElasticBSP reaches {target:.0%} at least 2x sooner than BSP (wall time). "
            f"Best ElasticBSP speedup over all passes: {top}. Goal {met}.")


if __name__ == "__main__":
    main()
