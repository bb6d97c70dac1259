"""The failure detector on a busy machine: no healthy server fenced, a killed or stopped one
failed over (``python bench/faults.py --under-load``).

Each try: two CPU hogs (``while True: pass`` processes, each ending by itself) run beside a
``--replicas 1`` ASP run of the MNIST MLP (2 workers, 2 shard servers, server SGD lr 0.1
momentum 0.9, ``--target-accuracy 0.97``). Once 300 iterations are recorded, server 1 gets a
real ``kill -9`` (or ``kill -STOP`` in the stop tries). Measured from the run's database:

- spurious fencing: ``server_unresponsive`` events before the fault (must be none);
- time to recovery: from the fault to the end of the first iteration that started after it
  (the workers train again; goal: within 3 s of a kill);
- for a stopped server, the time from ``kill -STOP`` to its fencing (the docs' bound:
  ``cluster.heartbeat_timeout_s`` x 10 of silence, 5 s by default);
- whether the run finished and reached the target.

Tries alternate between the kill and the stop where both are asked for; the hogs are restarted
for each try.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

TITLE = "Failure detection under load (`bench/faults.py --under-load`)"
FAULT_AFTER_ITERATIONS = 300
RECOVERY_GOAL_S = 3.0
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"


def hogs(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that each keep a core busy for ``seconds``, then end."""
    return [subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)])
            for _ in range(count)]


def _values(args: argparse.Namespace, name: str) -> dict[str, Any]:
    return {"cluster.workers": 2, "cluster.servers": 2, "cluster.replicas": 1,
            "sync.model": "asp", "data.dataset": args.dataset, "data.data_dir": args.data_dir,
            "train.epochs": args.epochs, "stop.target_accuracy": args.target,
            "eval.interval_s": 2.0, "name": name}


def _iterations(db: Path, run_id: str) -> int:
    try:
        return int(C.query_db(db, "SELECT count(*) FROM iterations WHERE run_id = ?",
                              run_id)[0][0])
    except sqlite3.Error:
        return 0


def _fault(launcher: Any, db: Path, sig: signal.Signals, after: int,
           at: dict[str, float]) -> None:
    """Once the run has recorded ``after`` iterations, send ``sig`` to server 1."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and launcher.children[0].process.poll() is None:
        if _iterations(db, launcher.run_id) >= after:
            server = next(c for c in launcher.children if c.role == "server" and c.rank == 1)
            at["fault"] = time.time()
            os.kill(server.process.pid, sig)
            return
        time.sleep(0.05)


def run_try(args: argparse.Namespace, db: Path, number: int, sig: signal.Signals
            ) -> dict[str, Any]:
    from engine.launcher import Launcher
    from engine.plan import build_config

    name = f"load-{number}-{sig.name}"
    launcher = Launcher(build_config({}, _values(args, name)), db=db)
    busy = hogs(args.hogs, args.hog_seconds)
    at: dict[str, float] = {}
    try:
        launcher.start()
        faulter = threading.Thread(target=_fault, args=(launcher, db, sig, args.fault_after, at),
                                   daemon=True)
        faulter.start()
        result = launcher.wait()
        faulter.join(timeout=5)
    finally:
        for hog in busy:
            hog.kill()
            hog.wait(timeout=10)
    row = measure(db, launcher.run_id, at.get("fault"))
    row.update(try_=number, signal=sig.name, status=result.status.value, reason=result.reason)
    print(f"  try {number} ({sig.name}): {row['status']}, spurious {row['spurious_fencing']}, "
          f"recovery {row['recovery_s']} s, fenced after {row['fenced_after_s']} s, best "
          f"{row['best_accuracy']}", flush=True)
    return row


def measure(db: Path, run_id: str, fault_at: float | None) -> dict[str, Any]:
    fenced = C.run_events(db, run_id, "server_unresponsive")
    slow = C.run_events(db, run_id, "server_slow")
    spurious = [d for at, d in fenced if fault_at is None or at < fault_at]
    after = [at for at, _ in fenced if fault_at is not None and at >= fault_at]
    first = None
    if fault_at is not None:
        first = C.query_db(db, "SELECT min(ended_at) FROM iterations WHERE run_id = ? AND "
                           "started_at > ?", run_id, fault_at)[0][0]
    best = C.query_db(db, "SELECT max(accuracy) FROM evaluations WHERE run_id = ?", run_id)
    return {"run_id": run_id, "fault_at": fault_at,
            "spurious_fencing": len(spurious), "slow_events": len(slow),
            "fenced_after_s": round(after[0] - fault_at, 3) if after and fault_at else None,
            "recovery_s": round(first - fault_at, 3) if first and fault_at else None,
            "best_accuracy": best[0][0] if best else None}


def verdicts(rows: list[dict[str, Any]], target: float) -> dict[str, Any]:
    def ok(row: dict[str, Any]) -> bool:
        recovered = row["recovery_s"] is not None and (
            row["signal"] != "SIGKILL" or row["recovery_s"] <= RECOVERY_GOAL_S)
        return (row["spurious_fencing"] == 0 and recovered and row["status"] == "finished"
                and (row["best_accuracy"] or 0) >= target)

    kills = [r for r in rows if r["signal"] == "SIGKILL"]
    stops = [r for r in rows if r["signal"] == "SIGSTOP"]
    return {"kills_ok": sum(map(ok, kills)), "kills": len(kills),
            "stops_ok": sum(map(ok, stops)), "stops": len(stops),
            "spurious_fencing": sum(r["spurious_fencing"] for r in rows),
            "recovery_s": sorted(r["recovery_s"] for r in kills if r["recovery_s"] is not None),
            "fenced_after_s": sorted(r["fenced_after_s"] for r in stops
                                     if r["fenced_after_s"] is not None)}


def docs_body(payload: dict[str, Any]) -> str:
    summary = payload["summary"]
    lines = [C.paragraph(
        f"{payload['hogs']} CPU hogs beside a `--replicas 1` ASP run (MNIST MLP, 2 workers, 2 "
        f"shard servers, `--target-accuracy {payload['target']}`); server 1 gets `kill -9` (or "
        f"`kill -STOP`) once {payload['fault_after']} iterations are recorded. Spurious "
        "fencing: `server_unresponsive` before the fault. Recovery: from the fault to the end "
        "of the first iteration started after it. Reproduce: `python bench/faults.py "
        "--under-load --data-dir ../shared/data/mnist`."), "",
        "| try | fault | status | spurious fencing | server_slow events | fenced after s | "
        "recovery s | best accuracy |", "|---|---|---|---|---|---|---|---|"]
    for row in payload["tries"]:
        best = row["best_accuracy"]
        lines.append(
            f"| {row['try_']} | {row['signal']} | {row['status']} | {row['spurious_fencing']} "
            f"| {row['slow_events']} | {row['fenced_after_s'] or '-'} | "
            f"{row['recovery_s'] or '-'} | {'-' if best is None else f'{best:.2%}'} |")
    met = summary["kills_ok"] == summary["kills"] and summary["stops_ok"] == summary["stops"]
    lines += ["", C.paragraph(
        f"Kills: {summary['kills_ok']} of {summary['kills']} tries met every goal (no spurious "
        f"fencing, training again within {RECOVERY_GOAL_S:g} s, finished at the target); "
        f"stops: {summary['stops_ok']} of {summary['stops']} (fenced and failed over, "
        f"finished). Goal {'met' if met else 'NOT met'}."), "",
        C.machine_note(payload["machine"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--under-load", action="store_true")
    parser.add_argument("--data-dir", default=None, help="folder of the MNIST IDX files")
    parser.add_argument("--tries", type=int, default=10, help="tries with kill -9")
    parser.add_argument("--stops", type=int, default=3, help="tries with kill -STOP")
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--fault-after", type=int, default=FAULT_AFTER_ITERATIONS,
                        help="recorded iterations before the fault")
    parser.add_argument("--quick", action="store_true", help="digits, 1 kill + 1 stop; docs "
                        "untouched")
    parser.add_argument("--db", type=Path, default=REPO / "bench" / "results" / "faults_load.db")
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.tries, args.stops, args.epochs, args.fault_after = 1, 1, 100, 100
    args.hog_seconds = 900.0
    args.db.unlink(missing_ok=True)
    plan = [signal.SIGKILL] * args.tries
    for index in range(args.stops):  # spread over the kills
        plan.insert(min(len(plan), 1 + index * 3), signal.SIGSTOP)
    rows = [run_try(args, args.db, n, sig) for n, sig in enumerate(plan, start=1)]
    payload = {"machine": C.machine_info(), "dataset": args.dataset, "hogs": args.hogs,
               "target": args.target, "fault_after": args.fault_after, "tries": rows,
               "summary": verdicts(rows, args.target)}
    path = C.write_result("faults_load" + ("-quick" if args.quick else ""), payload)
    print(f"wrote {path}")
    if not args.quick:
        C.update_docs_section(TITLE, docs_body(payload))
    print(payload["summary"])


if __name__ == "__main__":
    main()
