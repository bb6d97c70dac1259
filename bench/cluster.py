"""Beyond one machine on this machine: the same MNIST run started by ``psctl launch`` (local
processes), by ``psctl launch --backend ray`` on a Ray cluster of three loopback nodes (a head on
127.0.0.4, nodes on 127.0.0.2 and 127.0.0.3, 2 logical CPUs each), and through the join contract
(every role a ``psctl role`` command on its own 127.0.0.x address).

Measured per run: the time from the start of the command to the first iteration any worker
began (the launch overhead: starting, placing and joining the roles), the time to the end of
training, the final test accuracy, and the distinct nodes that served shards or ran workers.
The local launch is the baseline in every pass; passes alternate the order of the three.

The cluster starts once, before the first pass (it is not part of any launch's time), and
stops, by the pids this script started, at the end.

Reproduce: ``python bench/cluster.py --data-dir ../shared/data/mnist`` (about 15 minutes);
``--quick`` runs a digits version (docs untouched).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

WAYS = ("local", "ray", "by hand")
TITLE = "Ray backend and join contract (`bench/cluster.py`)"
# The join contract's places: each role on an address of its own.
PLACES = [("server", 0, "127.0.0.11"), ("server", 1, "127.0.0.12"),
          ("worker", 0, "127.0.0.13"), ("worker", 1, "127.0.0.14"),
          ("worker", 2, "127.0.0.15"), ("worker", 3, "127.0.0.16"),
          ("evaluator", 0, "127.0.0.17")]
RUN_TIMEOUT_S = 900


def run_options(args: argparse.Namespace, name: str) -> list[str]:
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    return ["--workers", "4", "--servers", "2", "--dataset", args.dataset, *data,
            "--epochs", str(args.epochs), "--name", name]


def _psctl(*words: str) -> list[str]:
    return [sys.executable, "-m", "psctl", *words]


def launch(args: argparse.Namespace, way: str, name: str, env: dict[str, str]) -> float:
    """Run one way to its end; the wall-clock time its command started."""
    started = time.time()
    if way == "by hand":
        return by_hand(args, name, env)
    extra = [] if way == "local" else ["--backend", "ray", "--ray-address", args.ray_address]
    done = subprocess.run(_psctl("launch", *run_options(args, name), *extra, "--no-live"),
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return started


def by_hand(args: argparse.Namespace, name: str, env: dict[str, str]) -> float:
    token = secrets.token_urlsafe(32)
    env = env | {"PSCTL_TOKEN": token, "PSCTL_COORDINATOR": "127.0.0.10:7777"}
    started = time.time()
    coordinator = subprocess.Popen(
        _psctl("role", "coordinator", "--host", "127.0.0.10", "--port", "7777",
               *run_options(args, name)), env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    roles = [subprocess.Popen(_psctl("role", role, "--host", host, *(
        ["--rank", str(rank)] if role != "evaluator" else [])), env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for role, rank, host in PLACES]
    for process in (coordinator, *roles):
        try:
            process.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return started


def measure(db: Path, name: str, started: float) -> dict[str, Any]:
    [(run_id, status)] = C.query_db(db, "SELECT id, status FROM runs WHERE name = ?", name)
    first, last = C.query_db(db, "SELECT min(started_at), max(ended_at) FROM iterations "
                                 "WHERE run_id = ?", run_id)[0]
    nodes = {str(detail.get("node")) for _, detail in C.run_events(db, run_id, "process_joined")
             if detail.get("role") in ("server", "worker")}
    outcome = C.training_outcome(db, run_id)
    return {"run_id": run_id, "status": status, "first_iteration_s": first - started,
            "end_s": last - started, "final_accuracy": outcome["final_accuracy"],
            "nodes": sorted(nodes)}


def one_pass(args: argparse.Namespace, ways: list[str], number: int,
             env: dict[str, str]) -> dict[str, Any]:
    runs = []
    for way in ways:
        name = f"cluster-{way.replace(' ', '-')}-{number}"
        started = launch(args, way, name, env)
        row = {"way": way, **measure(args.db, name, started)}
        print(f"  {way}: {row['status']}, first iteration {row['first_iteration_s']:.1f} s, "
              f"end {row['end_s']:.1f} s, final {row['final_accuracy']}, nodes {row['nodes']}",
              flush=True)
        runs.append(row)
    return {"order": "forward" if ways[0] == WAYS[0] else "reverse", "machine": C.machine_info(),
            "runs": runs}


def summarise(passes: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for way in WAYS:
        first, end, accuracy = [], [], []
        for one in passes:
            rows = {run["way"]: run for run in one["runs"]}
            base, row = rows["local"], rows[way]
            first.append(row["first_iteration_s"] / base["first_iteration_s"])
            end.append(row["end_s"] / base["end_s"])
            accuracy.append(row["final_accuracy"] - base["final_accuracy"])
        summary[way] = {"first_iteration_ratio": C.median(first), "end_ratio": C.median(end),
                        "accuracy_delta": C.median(accuracy)}
    return summary


def docs_body(payload: dict[str, Any]) -> str:
    lines = [C.paragraph(
        f"MNIST MLP, 4 workers, 2 servers, BSP, {payload['epochs']} epochs, started three ways: "
        "`psctl launch` (local processes, the baseline), `psctl launch --backend ray` on a Ray "
        "cluster of three loopback nodes (head 127.0.0.4, nodes 127.0.0.2 and 127.0.0.3, 2 "
        "logical CPUs each, `python -m engine.hosts.ray_local`), and the join contract (each "
        "role a `psctl role` command on its own 127.0.0.x address). First iteration: seconds "
        "from the start of the command to the first iteration a worker began. Reproduce: "
        "`python bench/cluster.py --data-dir ../shared/data/mnist`."), "",
        "| pass | way | status | first iteration s | training ended s | final accuracy | "
        "nodes with servers or workers |", "|---|---|---|---|---|---|---|"]
    for number, one in enumerate(payload["passes"], start=1):
        for run in one["runs"]:
            lines.append(f"| {number} | {run['way']} | {run['status']} | "
                         f"{run['first_iteration_s']:.1f} | {run['end_s']:.1f} | "
                         f"{run['final_accuracy']:.2%} | {', '.join(run['nodes'])} |")
    lines += ["", "Medians over the passes, against the local launch of the same pass:", "",
              "| way | time to the first iteration / local | time to the end / local | "
              "final accuracy - local |", "|---|---|---|---|"]
    for way, row in payload["summary"].items():
        lines.append(f"| {way} | {C.fmt_ratio(row['first_iteration_ratio'])} | "
                     f"{C.fmt_ratio(row['end_ratio'])} | "
                     f"{row['accuracy_delta'] * 100:+.2f} points |")
    lines += ["", C.machine_note(payload["passes"][0]["machine"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="folder of the MNIST IDX files")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="digits, 1 pass; docs untouched")
    parser.add_argument("--db", type=Path, default=REPO / "bench" / "results" / "cluster.db")
    parser.add_argument("--docs-only", action="store_true",
                        help="rewrite the docs section from bench/results/cluster.json")
    args = parser.parse_args()
    if args.docs_only:
        C.update_docs_section(TITLE, docs_body(json.loads((C.RESULTS / "cluster.json")
                                                          .read_text())))
        return
    from engine.hosts.ray_local import local_cluster

    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.passes, args.epochs = 1, 3
    args.db.unlink(missing_ok=True)
    passes = []
    with local_cluster(nodes=3, cpus=2, logs=args.db.parent / "cluster-ray") as cluster:
        args.ray_address = cluster.address
        env = os.environ | cluster.env | {"PSCTL_DB": str(args.db)}
        env.pop("PSCTL_TOKEN", None)
        for index in range(args.passes):
            ways = list(WAYS) if index % 2 == 0 else list(reversed(WAYS))
            print(f"pass {index + 1}: {', '.join(ways)}", flush=True)
            passes.append(one_pass(args, ways, index + 1, env))
    payload = {"dataset": args.dataset, "epochs": args.epochs, "passes": passes,
               "summary": summarise(passes)}
    path = C.write_result("cluster" + ("-quick" if args.quick else ""), payload)
    print(f"wrote {path}")
    if not args.quick:
        C.update_docs_section(TITLE, docs_body(payload))
    print(json.dumps(payload["summary"], indent=2))


if __name__ == "__main__":
    main()
