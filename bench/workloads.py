"""Workloads beyond the MLP: the built-in CNN (LeNet) on MNIST and Fashion-MNIST under BSP with 4
workers and 2 servers, against the default MLP on the same command (the baseline, run in the
same pass; passes alternate which goes first).

Measured per run: best and final test accuracy, the time from the first iteration to the end
of training, the time until the test accuracy first reached the target (99 % MNIST, 90 %
Fashion-MNIST; the issue's acceptance), and samples per second over all workers.

Reproduce: ``python bench/workloads.py --data-dir ../shared/data`` (about 25 minutes on 2
cores); ``--quick`` runs 1 epoch of 6000 images per data set (docs untouched).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

TITLE = "Workloads (`bench/workloads.py`)"
RUN_TIMEOUT_S = 1800
# data set -> (target accuracy, epochs, epoch at which the rate drops tenfold)
TARGETS = {"mnist": (0.99, 5, 3), "fashion-mnist": (0.90, 6, 4)}
MODELS = ("cnn", "mlp")


def command(dataset: str, model: str, args: argparse.Namespace, name: str) -> list[str]:
    _, epochs, drop = TARGETS[dataset]
    epochs = 1 if args.quick else epochs
    limit = ["--train-limit", "6000"] if args.quick else []
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    return ["launch", "--model", model, "--dataset", dataset, *data, *limit, "--workers", "4",
            "--servers", "2", "--sync", "bsp", "--epochs", str(epochs), "--lr", "0.05",
            "--lr-schedule", f"step:{drop}:0.1", "--lr-unit", "epochs", "--name", name,
            "--no-live"]


def run_one(args: argparse.Namespace, dataset: str, model: str, name: str) -> dict[str, Any]:
    words = command(dataset, model, args, name)
    env = os.environ | {"PSCTL_DB": str(args.db)}
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "psctl", *words], env=env, text=True,
                          capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    if done.returncode != 0:
        print(done.stdout[-1500:], done.stderr[-1500:], file=sys.stderr)
    [(run_id, status)] = C.query_db(args.db, "SELECT id, status FROM runs WHERE name = ?", name)
    outcome = C.training_outcome(args.db, run_id)
    target = TARGETS[dataset][0]
    best = C.query_db(args.db, "SELECT max(accuracy) FROM evaluations WHERE run_id = ?",
                      run_id)[0][0]
    reached = C.query_db(args.db, "SELECT min(at) FROM evaluations WHERE run_id = ? AND "
                                  "accuracy >= ?", run_id, target)[0][0]
    samples = C.query_db(args.db, "SELECT sum(samples) FROM iterations WHERE run_id = ?",
                         run_id)[0][0]
    begun = outcome["training_started"]
    row = {"dataset": dataset, "model": model, "run_id": run_id, "status": status,
           "command": "psctl " + " ".join(w for w in words if w != "--no-live"),
           "best_accuracy": best, "final_accuracy": outcome["final_accuracy"],
           "training_s": outcome["training_s"], "wall_s": time.time() - started,
           "target": target, "to_target_s": (reached - begun) if reached and begun else None,
           "samples_per_s": samples / outcome["training_s"] if outcome["training_s"] else None}
    print(f"  {dataset} {model}: {status}, best {best:.2%}, final "
          f"{outcome['final_accuracy']:.2%}, training {outcome['training_s']:.0f} s, "
          f"to {target:.0%}: {row['to_target_s']}", flush=True)
    return row


def docs_body(payload: dict[str, Any]) -> str:
    lines = [C.paragraph(
        "The built-in CNN (`--model cnn`: LeNet, 431,080 keys) against the default MLP "
        "(932,362 keys) on the same command: BSP, 4 workers, 2 servers, batch 64 per worker, "
        "server SGD with momentum 0.9 at rate 0.05, dropped tenfold at epoch 3 (MNIST) or 4 "
        "(Fashion-MNIST). Target: the issue's acceptance, 99 % on MNIST and 90 % on "
        "Fashion-MNIST; time to target counts from the first iteration. Reproduce: "
        "`python bench/workloads.py --data-dir ../shared/data`."), "",
        "| pass | data set | model | status | best accuracy | final accuracy | target | "
        "time to target s | training s | samples/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for number, one in enumerate(payload["passes"], start=1):
        for run in one["runs"]:
            to_target = (f"{run['to_target_s']:.0f}" if run["to_target_s"] is not None
                         else "not reached")
            lines.append(
                f"| {number} | {run['dataset']} | {run['model']} | {run['status']} | "
                f"{run['best_accuracy']:.2%} | {run['final_accuracy']:.2%} | "
                f"{run['target']:.0%} | {to_target} | {run['training_s']:.0f} | "
                f"{run['samples_per_s']:.0f} |")
    lines += ["", "The CNN's commands, as run:", ""]
    lines += [f"    {run['command']}" for run in payload["passes"][0]["runs"]
              if run["model"] == "cnn"]
    lines += ["", C.machine_note(payload["passes"][0]["machine"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="folder holding mnist/ and "
                        "fashion-mnist/ (or set PSCTL_DATA_DIR)")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 epoch of 6000; docs untouched")
    parser.add_argument("--db", type=Path, default=REPO / "bench" / "results" / "workloads.db")
    parser.add_argument("--docs-only", action="store_true",
                        help="rewrite the docs section from bench/results/workloads.json")
    args = parser.parse_args()
    if args.docs_only:
        C.update_docs_section(TITLE, docs_body(json.loads((C.RESULTS / "workloads.json")
                                                          .read_text())))
        return
    args.db.unlink(missing_ok=True)
    passes = []
    for index in range(args.passes):
        models = list(MODELS) if index % 2 == 0 else list(reversed(MODELS))
        print(f"pass {index + 1}: {', '.join(models)}", flush=True)
        machine = C.machine_info()
        runs = [run_one(args, dataset, model, f"workloads-{dataset}-{model}-{index + 1}")
                for dataset in TARGETS for model in models]
        passes.append({"order": "forward" if index % 2 == 0 else "reverse",
                       "machine": machine, "runs": runs})
    payload = {"passes": passes}
    path = C.write_result("workloads" + ("-quick" if args.quick else ""), payload)
    print(f"wrote {path}")
    if not args.quick:
        C.update_docs_section(TITLE, docs_body(payload))


if __name__ == "__main__":
    main()
