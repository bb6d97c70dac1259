"""Request scheduling by layer (seed 002) under SSP with one straggler, on MNIST.

Each schedule trains the MNIST MLP on real server and worker processes, as ``psctl launch`` does:
SSP with a staleness bound of 1, 4 workers, 2 shard servers, batch 64, worker 3 three times
slower (``--straggler 3:3x``), one request in flight (``--pool-size 1``), for a fixed time
budget. The schedules are fifo (the baseline, in the same pass), filo and stalest-first; each
layer's pull suspend time and push staleness come from the ``layer_iterations`` table. Passes
alternate the order of the schedules, so a drift in the machine's load does not favour the same
one.

Reproduce: ``python bench/scheduling.py [--order reverse] [--append]`` (about 4 minutes a
pass); ``--quick`` runs a tiny digits version (docs untouched).
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

BASELINE = "fifo"
SCHEDULES = ("fifo", "filo", "stalest-first")
DOCS_TITLE = "Request scheduling by layer (MNIST, SSP, one 3x straggler)"


def run_schedule(schedule: str, args: argparse.Namespace, db: Path) -> dict[str, Any]:
    from engine.launcher import Launcher
    from engine.plan import build_config

    values = {
        "cluster.workers": 4, "cluster.servers": 2, "sync.model": "ssp", "sync.staleness": 1,
        "data.dataset": args.dataset, "data.data_dir": args.data_dir, "train.epochs": 100,
        "eval.interval_s": 5.0, "stop.max_seconds": args.budget_s,
        "heterogeneity.stragglers": [{"rank": 3, "factor": 3.0}],
        "comm.schedule": schedule, "comm.pool_size": 1, "name": f"bench-schedule-{schedule}"}
    launcher = Launcher(build_config({}, values), db=db)
    launcher.start()
    result = launcher.wait()
    return {"schedule": schedule, "run_id": launcher.run_id, "status": result.status.value,
            **measure(db, launcher.run_id)}


def measure(db: Path, run_id: str) -> dict[str, Any]:
    """Per-layer requests of the run, read from ``layer_iterations`` and ``iterations``."""
    with sqlite3.connect(db) as conn:
        suspend, stale, stale_max, pulls = conn.execute(
            "SELECT avg(suspend_s), avg(staleness), max(staleness), count(*) "
            "FROM layer_iterations WHERE run_id = ?", (run_id,)).fetchone()
        fast = conn.execute(
            "SELECT avg(suspend_s) FROM layer_iterations WHERE run_id = ? AND worker != 3",
            (run_id,)).fetchone()[0]
        iterations, samples, first, last = conn.execute(
            "SELECT count(*), sum(samples), min(started_at), max(ended_at) FROM iterations "
            "WHERE run_id = ?", (run_id,)).fetchone()
        best = conn.execute("SELECT max(accuracy) FROM evaluations WHERE run_id = ?",
                            (run_id,)).fetchone()[0]
    conn.close()
    wall = (last - first) if iterations else None
    return {"suspend_ms_mean": None if suspend is None else 1e3 * suspend,
            "suspend_ms_mean_fast": None if fast is None else 1e3 * fast,
            "staleness_mean": stale, "staleness_max": stale_max, "layer_pulls": pulls,
            "iterations": iterations,
            "samples_per_s": samples / wall if wall else None, "best_accuracy": best}


def table(rows: list[dict[str, Any]]) -> list[str]:
    base = next((r for r in rows if r["schedule"] == BASELINE), None)
    lines = ["| schedule | status | mean suspend per layer pull | the same, workers 0-2 | "
             "suspend vs fifo | mean staleness | max staleness | samples/s | iterations |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ratio = ""
        if base and base["suspend_ms_mean"] and row["suspend_ms_mean"] is not None:
            ratio = C.fmt_ratio(row["suspend_ms_mean"] / base["suspend_ms_mean"])
        lines.append(
            f"| {row['schedule']} | {row['status']} | {_ms(row['suspend_ms_mean'])} | "
            f"{_ms(row['suspend_ms_mean_fast'])} | {ratio} | {_num(row['staleness_mean'])} | "
            f"{'' if row['staleness_max'] is None else row['staleness_max']} | "
            f"{_num(row['samples_per_s'], 0)} | {row['iterations']} |")
    return lines


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} ms"


def _num(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def verdict(passes: list[dict[str, Any]]) -> str:
    """The schedule with the least mean suspend per pass, and whether it won every pass."""
    winners = []
    for one in passes:
        measured = [r for r in one["results"] if r["suspend_ms_mean"] is not None]
        if measured:
            winners.append(min(measured, key=lambda r: r["suspend_ms_mean"])["schedule"])
    if not winners:
        return "No pass measured a suspend time."
    same = len(set(winners)) == 1
    return ("Least mean suspend per pass: " + ", ".join(winners) + "; "
            + (f"{winners[0]} in every pass." if same else
               "no schedule won every pass, so the differences are within the noise here."))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="seconds each schedule trains")
    C.add_pass_arguments(parser, "scheduling")
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.budget_s, args.data_dir = 15.0, None
    db = args.db or Path(f"/tmp/psctl-bench-scheduling-{int(time.time())}.db")
    order = SCHEDULES if args.order == "forward" else tuple(reversed(SCHEDULES))
    info = C.machine_info()
    rows = []
    for schedule in order:
        rows.append(run_schedule(schedule, args, db))
        print(f"{schedule}: {rows[-1]}", flush=True)
    rows.sort(key=lambda r: SCHEDULES.index(r["schedule"]))
    this_pass = {"order": args.order, "machine": info, "db": str(db), "results": rows}
    print("\n".join(table(rows)))
    if args.quick:
        return {"passes": [this_pass]}
    passes = [*(C.earlier_passes("scheduling") if args.append else []), this_pass]
    payload = {"parameters": {k: v for k, v in vars(args).items() if k != "db"},
               "passes": passes}
    C.write_result("scheduling", payload)
    C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(_docs_body(passes, args))))
    return payload


def _docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    body = [f"Command: `python bench/scheduling.py [--order reverse] [--append]`; SSP with "
            "staleness 1, 4 workers, 2 servers, worker 3 at 3x (`--straggler 3:3x`), MNIST "
            f"MLP, batch 64, one request in flight (`--pool-size 1`), {args.budget_s:.0f} s per "
            "schedule. Suspend: how long the servers held a layer's pull back (per layer pull); "
            "staleness per layer push; both from `layer_iterations`.", ""]
    body += C.pass_tables(passes, lambda one: table(one["results"]))
    body += [verdict(passes), "", C.machine_note(passes[-1]["machine"])]
    return body


if __name__ == "__main__":
    main()
