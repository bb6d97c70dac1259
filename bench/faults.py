"""What faults cost: failover and restart times, resume, lost and delayed frames, replication.

Each scenario trains the MNIST MLP on real processes, as ``psctl launch`` does (4 workers, 2
shard servers, batch 64, server SGD lr 0.1 momentum 0.9, seed 0, ``--epochs`` epochs), with one
fault or none. Baselines run in the same script: a clean BSP run and a clean ASP run in every
pass; each faulty run is compared with the clean run of its model in the same pass (training
time ratio, final accuracy difference). Passes alternate the scenario order.

Measured from each run's events: the time from a server's kill to the first pull served by the
new primary (``failover_complete``), from a worker's kill to its restart rejoining
(``worker_lost`` -> ``worker_rejoined``), frames dropped and sent again. The resume scenario
launches ASP with ``--checkpoint-every 5``, kills the launcher (every process of the run dies
with it) after ``--kill-after`` seconds of training, runs ``psctl resume``, and measures the time
from the command to the resumed run's first iteration and the iterations recorded against those
planned.

Reproduce: ``python bench/faults.py --data-dir ../shared/data/mnist`` (about 25 minutes);
``--quick`` runs a digits version in a few minutes (docs untouched). ``--under-load`` runs the
failure detector's trials beside CPU hogs instead (``bench/faults_load.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

SCENARIOS: dict[str, dict[str, Any]] = {
    "clean BSP": {"sync.model": "bsp"},
    "BSP, worker 1 killed": {"sync.model": "bsp", "fault.inject": ["kill:worker:1@{at}s"]},
    "BSP, 1 replica": {"sync.model": "bsp", "cluster.replicas": 1},
    "BSP, 1 replica, server 0 killed": {"sync.model": "bsp", "cluster.replicas": 1,
                                        "fault.inject": ["kill:server:0@{at}s"]},
    "BSP, drop 1% + delay 5 ms": {"sync.model": "bsp", "fault.inject": ["drop:1%", "delay:5ms"]},
    "clean ASP": {"sync.model": "asp"},
    "ASP, drop 1% + delay 5 ms": {"sync.model": "asp", "fault.inject": ["drop:1%", "delay:5ms"]},
}
TITLE = "Fault tolerance: failover, restart, resume and lossy links (`bench/faults.py`)"


def _values(args: argparse.Namespace, overrides: dict[str, Any], name: str) -> dict[str, Any]:
    faults = [spec.format(at=args.kill_after) for spec in overrides.get("fault.inject", [])]
    return {"cluster.workers": 4, "cluster.servers": 2, "data.dataset": args.dataset,
            "data.data_dir": args.data_dir, "train.epochs": args.epochs, "eval.interval_s": 5.0,
            "name": f"bench-{name}", **overrides, "fault.inject": faults}


def run_scenario(name: str, args: argparse.Namespace, db: Path) -> dict[str, Any]:
    from engine.launcher import Launcher
    from engine.plan import build_config

    launcher = Launcher(build_config({}, _values(args, SCENARIOS[name], name)), db=db)
    started = time.monotonic()
    launcher.start()
    result = launcher.wait()
    row = {"scenario": name, "run_id": launcher.run_id, "status": result.status.value,
           "wall_s": time.monotonic() - started, **_measured(db, launcher.run_id)}
    print(f"  {name}: {row['status']}, training {row['training_s']:.1f} s, final "
          f"{row['final_accuracy']}", flush=True)
    return row


def _measured(db: Path, run_id: str) -> dict[str, Any]:
    outcome = C.training_outcome(db, run_id)
    lost = [at for at, _ in C.run_events(db, run_id, "worker_lost")]
    back = [at for at, _ in C.run_events(db, run_id, "worker_rejoined")]
    links = [d for _, d in C.run_events(db, run_id, "link_faults")]
    return {
        **{k: outcome[k] for k in ("training_s", "iterations", "final_accuracy")},
        "failover_s": [d["seconds"] for _, d in C.run_events(db, run_id, "failover_complete")],
        "restart_s": [b - a for a, b in zip(lost, back, strict=False)],
        "dropped": sum(d["dropped"] for d in links), "resent": sum(d["resent"] for d in links),
    }


def run_resume(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    """Launch, kill the launcher mid-run, resume; the resume's costs."""
    env = dict(C.child_env(), PSCTL_DB=str(db), NO_COLOR="1")
    command = [sys.executable, "-m", "psctl", "launch", "--dataset", args.dataset, "--workers",
               "4", "--servers", "2", "--epochs", str(args.epochs), "--sync", "asp",
               "--checkpoint-every", "5", "--eval-interval", "5", "--no-live",
               "--name", "bench-resume"]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    before = {r for (r,) in C.query_db(db, "SELECT id FROM runs")} if db.exists() else set()
    launch = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    run_id = _await_training(db, before, args.kill_after)
    launch.send_signal(signal.SIGKILL)
    launch.wait(30)
    time.sleep(2.0)  # its processes die with it
    killed_at = time.time()  # = when psctl resume starts
    at_kill = C.query_db(db, "SELECT count(*) FROM iterations WHERE run_id = ?", run_id)[0][0]
    resumed = subprocess.run([sys.executable, "-m", "psctl", "resume", run_id, "--no-live"],
                             env=env, capture_output=True, text=True, timeout=3600)
    measured = _measured(db, run_id)
    planned = C.run_events(db, run_id, "training_started")[0][1]["total_iterations"]
    again = C.run_events(db, run_id, "training_resumed")
    first_new = C.query_db(db, "SELECT min(started_at) FROM iterations WHERE run_id = ? AND "
                           "started_at > ?", run_id, killed_at)[0][0]
    row = {"scenario": "ASP, launcher killed, psctl resume", "run_id": run_id,
           "status": C.query_db(db, "SELECT status FROM runs WHERE id = ?", run_id)[0][0],
           "resume_exit": resumed.returncode, "iterations_at_kill": at_kill,
           "planned_iterations": planned,
           "resume_to_training_s": (again[0][0] - killed_at) if again else None,
           "resume_to_first_iteration_s": (first_new - killed_at) if first_new else None,
           "checkpoint_bytes": [d["bytes"] for _, d in C.run_events(db, run_id, "checkpoint")][-1:],
           "checkpoint_s": [d["seconds"] for _, d in C.run_events(db, run_id, "checkpoint")],
           **measured}
    print(f"  resume: {row['status']}, {row['iterations']} of {planned} iterations, first "
          f"iteration {row['resume_to_first_iteration_s']} s after the command", flush=True)
    return row


def _await_training(db: Path, before: set[str], after_s: float) -> str:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            rows = C.query_db(db, "SELECT r.id, min(e.at) FROM runs r JOIN events e ON e.run_id = "
                              "r.id AND e.kind = 'training_started' GROUP BY r.id")
        except sqlite3.Error:
            continue
        for run_id, started in rows:
            if run_id not in before and time.time() - started >= after_s:
                return str(run_id)
    raise SystemExit("the resume scenario's run never trained")


def summarise(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per faulty scenario: its training time over its model's clean run in the same pass, and
    the final accuracy difference; median over passes."""
    rows: dict[str, dict[str, list[float]]] = {}
    for one in passes:
        by = {r["scenario"]: r for r in one["runs"]}
        for name, row in by.items():
            clean = by.get("clean ASP" if "ASP" in name else "clean BSP")
            if clean is None or row is clean or not row.get("training_s"):
                continue
            entry = rows.setdefault(name, {"time_ratio": [], "accuracy_delta": []})
            entry["time_ratio"].append(row["training_s"] / clean["training_s"])
            entry["accuracy_delta"].append(row["final_accuracy"] - clean["final_accuracy"])
    return {name: {k: C.median(v) for k, v in entry.items()} for name, entry in rows.items()}


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def docs_body(payload: dict[str, Any]) -> str:
    """The docs/benchmarks.md section: every run of every pass, the medians, the resume."""
    lines = [C.paragraph(
        f"MNIST MLP, 4 workers x 2 shard servers, {payload['epochs']} epochs, kills "
        f"{payload['kill_after_s']:g} s after training started; every faulty run against the "
        "clean run of its model in the same pass (training time ratio, final accuracy "
        "difference). Reproduce: `python bench/faults.py --data-dir ../shared/data/mnist`."),
        "", "| pass | scenario | training s | final accuracy | failover s | restart s | "
        "frames dropped / resent |", "|---|---|---|---|---|---|---|"]
    for number, one in enumerate(payload["passes"], start=1):
        for run in one["runs"]:
            failover = ", ".join(f"{s:.3f}" for s in run["failover_s"]) or "-"
            restart = ", ".join(f"{s:.2f}" for s in run["restart_s"]) or "-"
            lines.append(
                f"| {number} | {run['scenario']} | {_cell(run['training_s'], '.1f')} | "
                f"{_cell(run['final_accuracy'], '.2%')} | {failover} | {restart} | "
                f"{run['dropped']} / {run['resent']} |")
    lines += ["", "Medians over the passes:", "",
              "| scenario | training time / clean | final accuracy - clean |", "|---|---|---|"]
    for name, row in payload["summary"].items():
        lines.append(f"| {name} | {C.fmt_ratio(row['time_ratio'])} | "
                     f"{row['accuracy_delta'] * 100:+.2f} points |")
    resume = payload["resume"]
    saving = C.median(resume["checkpoint_s"]) if resume["checkpoint_s"] else None
    lines += ["", C.paragraph(
        f"Resume (ASP, checkpoints every 5 s, launcher killed with SIGKILL after "
        f"{payload['kill_after_s']:g} s of training at {resume['iterations_at_kill']} recorded "
        f"iterations): `psctl resume` exited {resume['resume_exit']}, the run "
        f"{resume['status']} with {resume['iterations']} of {resume['planned_iterations']} "
        f"planned iterations recorded, final accuracy {_cell(resume['final_accuracy'], '.2%')}; "
        f"training went on {_cell(resume['resume_to_training_s'], '.1f')} s after `psctl "
        f"resume` was started (processes, data and checkpoint loading included), the first new "
        f"iteration {_cell(resume['resume_to_first_iteration_s'], '.1f')} s after it. A "
        f"checkpoint of "
        f"the whole model took {_cell(saving, '.3f')} s "
        "(median) to save."), "", C.machine_note(payload["machine"])]
    return "\n".join(lines)


def main() -> None:
    C.reexec_with_malloc_env()
    if "--under-load" in sys.argv:  # the failure detector beside CPU hogs: its own script
        from bench import faults_load

        faults_load.main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="folder of the MNIST IDX files")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--kill-after", type=float, default=20.0,
                        help="seconds of training before a kill")
    parser.add_argument("--quick", action="store_true", help="digits, 1 pass; docs untouched")
    parser.add_argument("--db", type=Path, default=REPO / "bench" / "results" / "faults.db")
    parser.add_argument("--docs-only", action="store_true",
                        help="rewrite the docs section from bench/results/faults.json")
    args = parser.parse_args()
    if args.docs_only:
        payload = json.loads((C.RESULTS / "faults.json").read_text())
        C.update_docs_section(TITLE, docs_body(payload))
        return
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.passes, args.epochs, args.kill_after = 1, 60, 5.5
    args.db.unlink(missing_ok=True)
    passes = []
    for index in range(args.passes):
        names = list(SCENARIOS) if index % 2 == 0 else list(reversed(SCENARIOS))
        print(f"pass {index + 1}: {', '.join(names)}", flush=True)
        passes.append({"runs": [run_scenario(name, args, args.db) for name in names]})
    resume = run_resume(args, args.db)
    payload = {"machine": C.machine_info(), "dataset": args.dataset, "epochs": args.epochs,
               "kill_after_s": args.kill_after, "passes": passes, "resume": resume,
               "summary": summarise(passes)}
    path = C.write_result("faults" + ("-quick" if args.quick else ""), payload)
    print(f"wrote {path}")
    if not args.quick:
        C.update_docs_section(TITLE, docs_body(payload))
    print(json.dumps(payload["summary"], indent=2))
    os.environ.pop("PSCTL_DB", None)


if __name__ == "__main__":
    main()
