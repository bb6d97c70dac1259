"""What moving key ranges between servers costs: re-replication after a server dies and comes
back, and servers joining a running job (``psctl scale --servers``).

Each scenario trains the MNIST MLP on real processes, as ``psctl launch`` does (4 workers,
batch 64, server SGD lr 0.1 momentum 0.9, seed 0, ``--epochs`` epochs). Baselines run in the
same script, in every pass (passes alternate the order):

- ``BSP, 1 replica``: 2 servers, clean; and the same with server 0 killed ``--kill-after``
  seconds into training and server 1 killed ``--gap`` seconds later. The launcher restarts
  server 0, which takes copies of both ranges back from server 1 and serves range 0 again, so
  server 1's death loses nothing. Measured: each handoff (snapshot, write, restore, link), how
  long the chain's tail held acknowledgements meanwhile, each move of a primary, the failovers,
  and the training time and final accuracy against the clean run.
- ``ASP, 4 key ranges``: 2 servers, clean; and the same scaled to 4 servers ``--kill-after``
  seconds into training. Measured: each range's move (handoff, primary move, drop), and the
  workers' samples per second before the scale and from 2 s after it, each against the clean
  run over the same windows.

Reproduce: ``python bench/moves.py --data-dir ../shared/data/mnist`` (about 10 minutes);
``--quick`` runs a digits version in a few minutes (docs untouched).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

SCENARIOS: dict[str, dict[str, Any]] = {
    "clean BSP, 1 replica": {"sync.model": "bsp", "cluster.replicas": 1},
    "BSP, 1 replica, server 0 then server 1 killed": {
        "sync.model": "bsp", "cluster.replicas": 1,
        "fault.inject": ["kill:server:0@{at}s", "kill:server:1@{later}s"]},
    "clean ASP, 4 key ranges": {"sync.model": "asp", "cluster.key_ranges": 4},
    "ASP, 4 key ranges, 2 -> 4 servers": {"sync.model": "asp", "cluster.key_ranges": 4,
                                          "scale_servers": 4},
}
BASELINES = {"BSP, 1 replica, server 0 then server 1 killed": "clean BSP, 1 replica",
             "ASP, 4 key ranges, 2 -> 4 servers": "clean ASP, 4 key ranges"}
TITLE = "Moving key ranges: re-replication and servers joining (`bench/moves.py`)"
SETTLE_S = 2.0  # after a scale: the moves are done well within this (measured: < 0.5 s)


def values(args: argparse.Namespace, overrides: dict[str, Any], name: str) -> dict[str, Any]:
    faults = [spec.format(at=args.kill_after, later=args.kill_after + args.gap)
              for spec in overrides.get("fault.inject", [])]
    settings = {k: v for k, v in overrides.items() if k != "scale_servers"}
    return {"cluster.workers": 4, "cluster.servers": 2, "data.dataset": args.dataset,
            "data.data_dir": args.data_dir, "train.epochs": args.epochs, "eval.interval_s": 5.0,
            "name": f"bench-{name}", **settings, "fault.inject": faults}


def run_scenario(name: str, args: argparse.Namespace, db: Path) -> dict[str, Any]:
    from engine.launcher import Launcher
    from engine.plan import build_config

    launcher = Launcher(build_config({}, values(args, SCENARIOS[name], name)), db=db)
    scaled: dict[str, float] = {}
    launcher.start()
    target = SCENARIOS[name].get("scale_servers")
    if target is not None:
        threading.Thread(target=_scale_later, daemon=True,
                         args=(db, launcher.run_id, target, args.kill_after, scaled)).start()
    result = launcher.wait()
    row = {"scenario": name, "run_id": launcher.run_id, "status": result.status.value,
           **measured(db, launcher.run_id), "scaled_at": scaled.get("at")}
    print(f"  {name}: {row['status']}, training {row['training_s']:.1f} s, final "
          f"{row['final_accuracy']}", flush=True)
    return row


def _scale_later(db: Path, run_id: str, servers: int, after_s: float,
                 scaled: dict[str, float]) -> None:
    from psctl.scale import scale_run

    started = _await_event(db, run_id, "training_started", 600)
    time.sleep(max(0.0, started + after_s - time.time()))
    scaled["at"] = time.time()
    scale_run(db, run_id, servers, role="servers")


def _await_event(db: Path, run_id: str, kind: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = C.run_events(db, run_id, kind)
        except sqlite3.Error:
            found = []
        if found:
            return float(found[0][0])
        time.sleep(0.2)
    raise SystemExit(f"run {run_id[:8]} never recorded {kind}")


def measured(db: Path, run_id: str) -> dict[str, Any]:
    details = {kind: [d for _, d in C.run_events(db, run_id, kind)]
               for kind in ("rereplicated", "primary_moved", "copy_dropped_from",
                            "failover_complete", "server_lost", "move_failed",
                            "rereplication_failed")}
    return {
        **C.training_outcome(db, run_id),
        "handoffs": [{k: d.get(k) for k in ("index", "rank", "seconds", "held_s", "restore_s",
                                            "bytes")} for d in details["rereplicated"]],
        "primary_moves": [{k: d.get(k) for k in ("index", "rank", "previous", "seconds",
                                                 "drain_s")} for d in details["primary_moved"]],
        "drops": len(details["copy_dropped_from"]),
        "failover_s": [d["seconds"] for d in details["failover_complete"]],
        "servers_lost": len(details["server_lost"]),
        "failed_moves": len(details["move_failed"]) + len(details["rereplication_failed"]),
    }


def samples_per_s(db: Path, run_id: str, start: float, end: float, batch: int = 64) -> float:
    """Samples all workers finished per second between two unix times."""
    count = C.query_db(db, "SELECT count(*) FROM iterations WHERE run_id = ? AND ended_at >= ? "
                       "AND ended_at < ?", run_id, start, end)[0][0]
    return float(count) * batch / (end - start) if end > start else 0.0


def scale_windows(db: Path, scaled: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """The scaled run's samples/s before its scale and from SETTLE_S after it, and the clean
    run's over the same windows (seconds since each run's training started)."""
    offset = scaled["scaled_at"] - scaled["training_started"]
    end = min(scaled["training_s"], clean["training_s"])
    windows = {"before": (0.0, offset), "after": (offset + SETTLE_S, end)}
    result: dict[str, Any] = {"scale_offset_s": offset}
    for label, (a, b) in windows.items():
        mine = samples_per_s(db, scaled["run_id"], scaled["training_started"] + a,
                             scaled["training_started"] + b)
        theirs = samples_per_s(db, clean["run_id"], clean["training_started"] + a,
                               clean["training_started"] + b)
        result[label] = {"window_s": [round(a, 2), round(b, 2)], "samples_per_s": mine,
                         "clean_samples_per_s": theirs,
                         "ratio": mine / theirs if theirs else None}
    return result


def summarise(db: Path, passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario with a baseline: training time over the baseline's in the same pass, the
    final accuracy difference, and (scaling) the throughput ratios; medians over passes."""
    rows: dict[str, dict[str, list[float]]] = {}
    for one in passes:
        by = {r["scenario"]: r for r in one["runs"]}
        for name, base in BASELINES.items():
            row, clean = by.get(name), by.get(base)
            if not row or not clean or not row["training_s"] or not clean["training_s"]:
                continue
            entry = rows.setdefault(name, {"time_ratio": [], "accuracy_delta": []})
            entry["time_ratio"].append(row["training_s"] / clean["training_s"])
            entry["accuracy_delta"].append(row["final_accuracy"] - clean["final_accuracy"])
            if row.get("scaled_at"):
                row["windows"] = scale_windows(db, row, clean)
                for label in ("before", "after"):
                    ratio = row["windows"][label]["ratio"]
                    if ratio is not None:
                        entry.setdefault(f"throughput_{label}", []).append(ratio)
    return {name: {k: C.median(v) for k, v in entry.items() if v}
            for name, entry in rows.items()}


def _list(values: list[Any], fmt: str) -> str:
    return ", ".join(format(v, fmt) for v in values if v is not None) or "-"


def docs_body(payload: dict[str, Any]) -> str:
    lines = [C.paragraph(
        f"MNIST MLP, 4 workers, {payload['epochs']} epochs. Re-replication: BSP on 2 servers "
        f"with `--replicas 1`, server 0 killed {payload['kill_after_s']:g} s into training and "
        f"server 1 {payload['gap_s']:g} s later (the launcher restarts server 0, which takes "
        "copies of both ranges back and serves range 0 again before server 1 dies). Scaling: "
        f"ASP on 2 servers with `--key-ranges 4`, `psctl scale --servers 4` "
        f"{payload['kill_after_s']:g} s into training. Every run against the clean run of its "
        "kind in the same pass. Reproduce: `python bench/moves.py --data-dir "
        "../shared/data/mnist`."), "",
        "| pass | scenario | status | training s | final accuracy | handoffs s (acks held s) "
        "| primary moves s | failovers s |", "|---|---|---|---|---|---|---|---|"]
    for number, one in enumerate(payload["passes"], start=1):
        for run in one["runs"]:
            handoffs = ", ".join(f"{h['seconds']:.3f} ({h['held_s']:.3f})"
                                 for h in run["handoffs"]) or "-"
            moves = _list([m["seconds"] for m in run["primary_moves"]], ".3f")
            lines.append(
                f"| {number} | {run['scenario']} | {run['status']} | {run['training_s']:.1f} | "
                f"{run['final_accuracy']:.2%} | {handoffs} | {moves} | "
                f"{_list(run['failover_s'], '.3f')} |")
    lines += ["", "Medians over the passes:", "",
              "| scenario | training time / clean | final accuracy - clean | samples/s before "
              "the scale / clean | samples/s after / clean |", "|---|---|---|---|---|"]
    for name, row in payload["summary"].items():
        before, after = row.get("throughput_before"), row.get("throughput_after")
        lines.append(f"| {name} | {C.fmt_ratio(row['time_ratio'])} | "
                     f"{row['accuracy_delta'] * 100:+.2f} points | "
                     f"{'-' if before is None else C.fmt_ratio(before)} | "
                     f"{'-' if after is None else C.fmt_ratio(after)} |")
    lines += ["", C.machine_note(payload["machine"])]
    return "\n".join(lines)


def main() -> None:
    C.reexec_with_malloc_env()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="folder of the MNIST IDX files")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--kill-after", type=float, default=15.0,
                        help="seconds of training before the first kill, or the scale")
    parser.add_argument("--gap", type=float, default=15.0,
                        help="seconds between the two kills")
    parser.add_argument("--quick", action="store_true", help="digits, 1 pass; docs untouched")
    parser.add_argument("--db", type=Path, default=REPO / "bench" / "results" / "moves.db")
    parser.add_argument("--docs-only", action="store_true",
                        help="rewrite the docs section from bench/results/moves.json")
    args = parser.parse_args()
    if args.docs_only:
        C.update_docs_section(TITLE, docs_body(json.loads((C.RESULTS / "moves.json").read_text())))
        return
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.passes, args.epochs, args.kill_after, args.gap = 1, 60, 4.0, 5.0
    args.db.unlink(missing_ok=True)
    passes = []
    for index in range(args.passes):
        names = list(SCENARIOS) if index % 2 == 0 else list(reversed(SCENARIOS))
        print(f"pass {index + 1}: {', '.join(names)}", flush=True)
        passes.append({"runs": [run_scenario(name, args, args.db) for name in names]})
    payload = {"machine": C.machine_info(), "dataset": args.dataset, "epochs": args.epochs,
               "kill_after_s": args.kill_after, "gap_s": args.gap, "passes": passes,
               "summary": summarise(args.db, passes)}
    path = C.write_result("moves" + ("-quick" if args.quick else ""), payload)
    print(f"wrote {path}")
    if not args.quick:
        C.update_docs_section(TITLE, docs_body(payload))
    print(json.dumps(payload["summary"], indent=2))


if __name__ == "__main__":
    main()
