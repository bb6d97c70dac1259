"""Sandblaster L-BFGS against Downpour SGD with Adagrad (DistBelief, seed 004) on MNIST: test
accuracy over time, the same time budget, 4 workers and 2 servers each.

- L-BFGS: ``--optimizer lbfgs``, each evaluation a full pass over the 60,000 training images
  summed from 32 portions (backup copies on), m = 10, Armijo backtracking from step 1.
- Downpour (the baseline): ``--sync asp --optimizer adagrad --fetch-every 4 --push-every 4``,
  the setting docs/learning.md measured at 97 % in about 30 s.

Each pass runs both, alternating which goes first. Measured per run: the test accuracy reached
by fixed times after training started (the last evaluation at or before each mark), the time to
90 % and 95 %, the best accuracy, and for L-BFGS the passes and iterations made.

Reproduce: ``python bench/lbfgs.py --data-dir ../shared/data`` (about 13 minutes on 2 cores
with the default 2 passes of 2 runs of 180 s).
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

TITLE = "Sandblaster L-BFGS against Downpour with Adagrad (`bench/lbfgs.py`)"
BUDGET_S = 180
MARKS_S = (15, 30, 60, 90, 120, 150)
TARGETS = (0.90, 0.95)
COMMON = ("--dataset", "mnist", "--workers", "4", "--servers", "2", "--eval-interval", "5")
METHODS = {
    "lbfgs": ("--optimizer", "lbfgs", "--epochs", "400"),
    "downpour-adagrad": ("--sync", "asp", "--optimizer", "adagrad", "--fetch-every", "4",
                         "--push-every", "4", "--epochs", "40"),
}


def command(method: str, args: argparse.Namespace, name: str) -> list[str]:
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    return ["launch", *COMMON, *data, *METHODS[method], "--max-seconds", str(args.budget),
            "--name", name, "--no-live"]


def run_one(args: argparse.Namespace, method: str, name: str) -> dict[str, Any]:
    words = command(method, args, name)
    env = os.environ | {"PSCTL_DB": str(args.db)}
    done = subprocess.run([sys.executable, "-m", "psctl", *words], env=env, text=True,
                          capture_output=True, timeout=args.budget + 300, check=False)
    if done.returncode != 0:
        print(done.stdout[-1500:], done.stderr[-1500:], file=sys.stderr)
    [(run_id, status)] = C.query_db(args.db, "SELECT id, status FROM runs WHERE name = ?", name)
    begun = C.training_outcome(args.db, run_id)["training_started"]
    curve = [(at - begun, accuracy) for at, accuracy in C.query_db(
        args.db, "SELECT at, accuracy FROM evaluations WHERE run_id = ? ORDER BY at", run_id)]
    steps = C.run_events(args.db, run_id, "lbfgs_step")
    passes = C.run_events(args.db, run_id, "lbfgs_pass")
    row = {"method": method, "run_id": run_id, "status": status, "curve": curve,
           "command": "psctl " + " ".join(w for w in words if w != "--no-live"),
           "at_marks": {str(mark): _at(curve, mark) for mark in MARKS_S},
           "to_target_s": {str(t): next((s for s, a in curve if a >= t), None) for t in TARGETS},
           "best_accuracy": max((a for _, a in curve), default=None),
           "lbfgs_passes": len(passes), "lbfgs_iterations": len(steps),
           "pass_s": C.median([p["seconds"] for _, p in passes]) if passes else None,
           "backups_won": sum(p["backups_won"] for _, p in passes)}
    print(f"  {method}: {status}, best {row['best_accuracy']:.2%}, at marks "
          f"{row['at_marks']}, to targets {row['to_target_s']}", flush=True)
    return row


def _at(curve: list[tuple[float, float]], mark: float) -> float | None:
    """The accuracy of the last evaluation at or before ``mark`` seconds of training."""
    reached = [accuracy for seconds, accuracy in curve if seconds <= mark]
    return reached[-1] if reached else None


def docs_body(payload: dict[str, Any]) -> str:
    marks = " | ".join(f"{m} s" for m in MARKS_S)
    lines = [C.paragraph(
        "DistBelief (seed 004) compared Sandblaster L-BFGS with Downpour SGD and found Downpour "
        "with Adagrad the better use of a given number of machines. Here: MNIST MLP, 4 workers, "
        f"2 servers, {payload['budget_s']} s each (`--max-seconds`), test accuracy every 5 s. "
        "L-BFGS: `--optimizer lbfgs` (full-batch passes of 32 portions, backups on, m = 10). "
        "Downpour: `--sync asp --optimizer adagrad --fetch-every 4 --push-every 4`. Accuracy "
        "at each mark is the last evaluation at or before it, counted from the start of "
        "training. Reproduce: `python bench/lbfgs.py --data-dir ../shared/data`."), "",
        f"| pass | method | status | {marks} | best | to 90 % s | to 95 % s | L-BFGS passes "
        "(iterations) | s per pass |",
        "|---|---|---|" + "---|" * len(MARKS_S) + "---|---|---|---|---|"]
    for number, one in enumerate(payload["passes"], start=1):
        for run in one["runs"]:
            at = " | ".join(_pct(run["at_marks"][str(m)]) for m in MARKS_S)
            to = [run["to_target_s"][str(t)] for t in TARGETS]
            lbfgs = (f"{run['lbfgs_passes']} ({run['lbfgs_iterations']})"
                     if run["method"] == "lbfgs" else "")
            per_pass = f"{run['pass_s']:.1f}" if run["pass_s"] else ""
            lines.append(
                f"| {number} | {run['method']} | {run['status']} | {at} | "
                f"{_pct(run['best_accuracy'])} | "
                + " | ".join(f"{t:.0f}" if t is not None else "not reached" for t in to)
                + f" | {lbfgs} | {per_pass} |")
    lines += ["", C.paragraph(verdict(payload)), "", "The commands, as run:", ""]
    lines += [f"    {run['command']}" for run in payload["passes"][0]["runs"]]
    lines += ["", C.machine_note(payload["passes"][0]["machine"])]
    return "\n".join(lines)


def verdict(payload: dict[str, Any]) -> str:
    """Which method won, pass by pass, by best accuracy within the budget."""
    wins = []
    for one in payload["passes"]:
        best = {run["method"]: run["best_accuracy"] or 0.0 for run in one["runs"]}
        wins.append(max(best, key=lambda method: best[method]))
    if len(set(wins)) == 1:
        return (f"Winner here: {wins[0]}, in every pass (higher accuracy at every mark that "
                "both reached, and the best accuracy within the budget)."
                if all(_ahead(one, wins[0]) for one in payload["passes"]) else
                f"Winner here by best accuracy within the budget: {wins[0]}, in every pass.")
    return f"No clear winner here: the passes disagree ({', '.join(wins)})."


def _ahead(one: dict[str, Any], method: str) -> bool:
    runs = {run["method"]: run for run in one["runs"]}
    other = next(m for m in runs if m != method)
    pairs = [(runs[method]["at_marks"][str(m)], runs[other]["at_marks"][str(m)])
             for m in MARKS_S]
    return all(a >= b for a, b in pairs if a is not None and b is not None)


def _pct(value: float | None) -> str:
    return f"{value:.2%}" if value is not None else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="folder holding mnist/")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--budget", type=int, default=BUDGET_S, help="seconds per run")
    parser.add_argument("--db", type=Path, default=REPO / "bench" / "results" / "lbfgs.db")
    parser.add_argument("--docs-only", action="store_true",
                        help="rewrite the docs section from bench/results/lbfgs.json")
    args = parser.parse_args()
    if args.docs_only:
        C.update_docs_section(TITLE, docs_body(json.loads((C.RESULTS / "lbfgs.json")
                                                          .read_text())))
        return
    args.db.unlink(missing_ok=True)
    passes = []
    for index in range(args.passes):
        methods = list(METHODS) if index % 2 == 0 else list(reversed(METHODS))
        print(f"pass {index + 1}: {', '.join(methods)}", flush=True)
        machine = C.machine_info()
        runs = [run_one(args, method, f"lbfgs-bench-{method}-{index + 1}")
                for method in methods]
        passes.append({"order": "forward" if index % 2 == 0 else "reverse",
                       "machine": machine, "runs": runs, "ended": time.time()})
    payload = {"budget_s": args.budget, "passes": passes}
    path = C.write_result("lbfgs", payload)
    print(f"wrote {path}")
    C.update_docs_section(TITLE, docs_body(payload))


if __name__ == "__main__":
    main()
