"""The dense push/pull path before and after a change: ``bench/pushpull.py`` run in a checkout
of an earlier commit and in this tree, alternately (old, new, new, old, ...), on the same machine.

Each run reports psctl's round trips per second and its ratio to the raw-websocket baseline it
measures in the same run; this script compares those ratios (the baseline absorbs machine noise
that hits both halves of one run) and the absolute rates, per layout, as medians over passes.

Run: ``python bench/before_after.py --ref 76de7b0`` (about 5 minutes). Writes
``bench/results/before_after.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LAYOUTS = ("1 shard, pipelined", "1 shard, sequential", "2 shards, pipelined")


def run_pushpull(tree: Path, rounds: int) -> dict[str, Any]:
    subprocess.run([sys.executable, "bench/pushpull.py", "--no-docs", "--rounds", str(rounds)],
                   cwd=tree, check=True, stdout=subprocess.DEVNULL, timeout=900)
    results: dict[str, Any] = json.loads((tree / "bench/results/pushpull.json").read_text())
    return results["results"]


def summarise(passes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {layout: {
        "ratio_to_raw": statistics.median(p[layout]["median_paired_ratio"] for p in passes),
        "psctl_rt_per_s": statistics.median(p[layout]["psctl_rt_per_s"] for p in passes),
    } for layout in LAYOUTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", required=True, help="the earlier commit (tag, branch or sha)")
    parser.add_argument("--passes", type=int, default=2, help="runs of each side [2]")
    parser.add_argument("--rounds", type=int, default=3, help="pushpull rounds per run [3]")
    parser.add_argument("--out", default="before_after.json",
                        help="result file name in bench/results [before_after.json]")
    args = parser.parse_args()
    old_passes: list[dict[str, Any]] = []
    new_passes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="psctl-before-") as scratch:
        old_tree = Path(scratch) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), args.ref],
                       cwd=REPO, check=True, capture_output=True)
        try:
            for index in range(args.passes):
                order = [("old", old_tree), ("new", REPO)]
                for side, tree in order if index % 2 == 0 else order[::-1]:
                    (old_passes if side == "old" else new_passes).append(
                        run_pushpull(tree, args.rounds))
                    print(f"pass {index + 1}: {side} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=REPO,
                           check=False, capture_output=True)
    old, new = summarise(old_passes), summarise(new_passes)
    report = {"benchmark": "before_after", "ref": args.ref, "at": time.time(),
              "passes": args.passes, "rounds": args.rounds, "old": old, "new": new,
              "new_over_old_ratio": {k: new[k]["ratio_to_raw"] / old[k]["ratio_to_raw"]
                                     for k in LAYOUTS},
              "new_over_old_rate": {k: new[k]["psctl_rt_per_s"] / old[k]["psctl_rt_per_s"]
                                    for k in LAYOUTS}}
    out = REPO / "bench/results" / args.out
    out.write_text(json.dumps(report, indent=1) + "\n")
    for layout in LAYOUTS:
        print(f"{layout}: ratio to raw old {old[layout]['ratio_to_raw']:.3f} new "
              f"{new[layout]['ratio_to_raw']:.3f} (new/old "
              f"{report['new_over_old_ratio'][layout]:.3f}); rt/s old "
              f"{old[layout]['psctl_rt_per_s']:.0f} new {new[layout]['psctl_rt_per_s']:.0f}")


if __name__ == "__main__":
    main()
