"""End to end before and after a change: the MNIST BSP run of 4 workers x 2 shard servers to 98 %
test accuracy, launched in a checkout of an earlier commit and in this tree, alternately.

Each run is ``psctl launch --workers 4 --servers 2 --sync bsp --dataset mnist --target-accuracy
0.98`` with the defaults otherwise (batch 64 per worker, SGD lr 0.1 momentum 0.9), a fresh
database per run, and ``--max-seconds`` as a guard. Measured: the command's wall time (start-up
included), and the run's own time to 98 % (the first evaluation at or above it, from the
database). Passes alternate (old, new, new, old, ...); the ratio is the median of the per-pass
ratios new / old of the wall time.

Run: ``python bench/end_to_end.py --ref cbd82af`` (about 6 minutes). Writes
``bench/results/end_to_end.json`` and the section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C

NAME = "end_to_end"
SECTION = "End to end before and after issue 20 (bench/end_to_end.py)"
TARGET = 0.98
GOAL = 0.7
COMMAND = ("launch", "--workers", "4", "--servers", "2", "--sync", "bsp", "--dataset", "mnist",
           "--target-accuracy", str(TARGET), "--no-live")


def one_run(tree: Path, data_dir: str, max_seconds: float, scratch: Path) -> dict[str, Any]:
    db = scratch / f"run-{time.monotonic_ns()}.db"
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "psctl", *COMMAND, "--data-dir", data_dir,
                           "--max-seconds", str(max_seconds)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=max_seconds + 300, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"psctl launch failed in {tree}:\n{done.stderr[-2000:]}")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        reached = conn.execute("SELECT MIN(elapsed_s) FROM evaluations WHERE accuracy >= ?",
                               (TARGET,)).fetchone()[0]
        best = conn.execute("SELECT MAX(accuracy) FROM evaluations").fetchone()[0]
        iterations = conn.execute("SELECT COUNT(*) FROM iterations").fetchone()[0]
    return {"wall_s": wall, "to_target_s": reached, "best_accuracy": best,
            "iterations": iterations}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ref", required=True, help="the commit before the change")
    parser.add_argument("--passes", type=int, default=2, help="runs of each side [2]")
    parser.add_argument("--data-dir", default=str(C.REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args(argv)
    info = C.machine_info()
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="psctl-e2e-") as scratch_name:
        scratch = Path(scratch_name)
        old_tree = scratch / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), args.ref],
                       cwd=C.REPO, check=True, capture_output=True)
        try:
            for index in range(args.passes):
                order = [("old", old_tree), ("new", C.REPO)]
                for side, tree in order if index % 2 == 0 else order[::-1]:
                    runs[side].append(one_run(tree, args.data_dir, args.max_seconds, scratch))
                    print(f"pass {index + 1} {side}: {runs[side][-1]}", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=C.REPO,
                           check=False, capture_output=True)
    ratios = C.paired_ratios([r["wall_s"] for r in runs["new"]],
                             [r["wall_s"] for r in runs["old"]])
    payload = {"benchmark": NAME, "machine": info, "ref": args.ref,
               "command": ["psctl", *COMMAND], "runs": runs, "wall_ratios": ratios,
               "median_wall_ratio": C.median(ratios), "goal": f"new / old <= {GOAL}",
               "goal_met": C.median(ratios) <= GOAL}
    C.write_result(NAME, payload)
    body = docs_body(payload)
    print(body)
    C.update_docs_section(SECTION, body)
    return payload


def docs_body(payload: dict[str, Any]) -> str:
    rows = ["| pass | before: wall time | to 98 % | after: wall time | to 98 % | after / before "
            "(wall) |", "|---|---|---|---|---|---|"]
    for number, (old, new, ratio) in enumerate(zip(payload["runs"]["old"], payload["runs"]["new"],
                                                   payload["wall_ratios"], strict=True), start=1):
        rows.append(f"| {number} | {old['wall_s']:.0f} s | {_seconds(old['to_target_s'])} | "
                    f"{new['wall_s']:.0f} s | {_seconds(new['to_target_s'])} | {ratio:.2f} |")
    verdict = "met" if payload["goal_met"] else "not met"
    return "\n".join([
        C.paragraph(f"`psctl {' '.join(payload['command'][1:])} --data-dir DIR` launched in a "
                    f"checkout of `{payload['ref']}` (before issue 20) and in this tree, "
                    "alternately, a fresh database per run. Wall time: the whole command, "
                    "start-up included; to 98 %: the run's first evaluation at or above it."),
        "", *rows, "",
        C.paragraph(f"Goal: after / before <= {GOAL} (median of the passes): measured "
                    f"{payload['median_wall_ratio']:.2f}, {verdict}."), "",
        "Reproduce: `python bench/end_to_end.py --ref cbd82af` (about 6 minutes). Raw "
        "results: `bench/results/end_to_end.json`.", "", C.machine_note(payload["machine"])])


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.0f} s"


if __name__ == "__main__":
    main()
