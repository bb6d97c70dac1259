"""The pull filter on sparse key ranges (issue 44): the bytes a worker receives and its samples per
second, with ``--pull-filter significant:DELTA`` against without, on 2^40 hashed features.

Each pass launches the same run twice, with and without the filter, in alternating order:
``psctl launch --model logreg --dataset sparse-synthetic:features=2^40,nnz=50,alpha=1.1
--optimizer adagrad --workers 4 --servers 2 --sync bounded-delay --max-seconds BUDGET`` (every
worker trains to the end of the budget; the same seed and data). From each run's database: the
bytes received per sample (pull answers and push acks), samples per second, and the objective at
the last evaluation. Reported: filtered / unfiltered per pass and the mean with a 95 % interval
(Student t over the passes' log ratios).

Run: ``python bench/sparse_pull_filter.py`` (about 1.5 minutes a pass; ``--passes N``,
``--quick`` for one pass of 20 s runs). Writes ``bench/results/sparse_pull_filter.json`` and its
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _common as C
from engine.analysis.intervals import Ratio, paired_ratio

NAME, TITLE = "sparse_pull_filter", "Pull filters on sparse key ranges (issue 44)"
DATASET = "sparse-synthetic:features=2^40,nnz=50,alpha=1.1"
COMMAND = ["--model", "logreg", "--dataset", DATASET, "--optimizer", "adagrad", "--workers", "4",
           "--servers", "2", "--sync", "bounded-delay", "--no-live"]


def launch(budget_s: float, pull_filter: str, db: Path) -> dict[str, Any]:
    command = ["psctl", "launch", *COMMAND, "--max-seconds", f"{budget_s:g}",
               "--pull-filter", pull_filter]
    done = subprocess.run(command, cwd=db.parent, capture_output=True, text=True,
                          timeout=budget_s + 300, env={**os.environ, "PSCTL_DB": str(db)})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stdout[-800:]}{done.stderr[-800:]}")
    run_id = C.query_db(db, "SELECT id FROM runs")[0][0]
    received, samples, started, ended = C.query_db(
        db, "SELECT sum(bytes_received), sum(samples), min(started_at), max(ended_at) FROM "
            "iterations WHERE run_id = ?", run_id)[0]
    losses = [row[0] for row in C.query_db(
        db, "SELECT loss FROM evaluations WHERE run_id = ? ORDER BY at", run_id)]
    return {"command": " ".join(command), "bytes_received_per_sample": received / samples,
            "samples_per_s": samples / (ended - started), "objective_last": losses[-1]}


def ratio(rows: list[dict[str, Any]], metric: str, lower_is_better: bool) -> Ratio | None:
    return paired_ratio({r["pass"]: r["none"][metric] for r in rows},
                        {r["pass"]: r["filtered"][metric] for r in rows},
                        lower_is_better=lower_is_better)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=40.0)
    parser.add_argument("--delta", default="0.001")
    parser.add_argument("--quick", action="store_true", help="one pass of 20 s runs")
    args = parser.parse_args()
    passes, budget = (1, 20.0) if args.quick else (args.passes, args.budget_s)
    info, rows = C.machine_info(), []
    with tempfile.TemporaryDirectory(prefix="psctl-pull-filter-") as folder:
        for k in range(passes):
            order = ("filtered", "none") if k % 2 == 0 else ("none", "filtered")
            row: dict[str, Any] = {"pass": k, "order": list(order)}
            for which in order:
                spec = f"significant:{args.delta}" if which == "filtered" else "none"
                row[which] = launch(budget, spec, Path(folder) / f"{k}-{which}.db")
            rows.append(row)
            print(json.dumps(row), flush=True)
    # Bytes: a ratio, filtered / none (< 1: fewer); speed and objective likewise, not inverted.
    summary = {metric: _plain(ratio(rows, metric, lower_is_better=False))
               for metric in ("bytes_received_per_sample", "samples_per_s", "objective_last")}
    C.write_result(NAME, {"machine": info, "budget_s": budget, "delta": args.delta,
                          "passes": rows, "summary": summary})
    _docs(rows, summary, info, budget, args.delta)
    print(json.dumps(summary))


def _plain(found: Ratio | None) -> dict[str, float | None]:
    if found is None:
        return {"ratio": None, "low": None, "high": None}
    return {"ratio": found.ratio, "low": found.low, "high": found.high}


def _docs(rows: list[dict[str, Any]], summary: dict[str, Any], info: dict[str, Any],
          budget: float, delta: str) -> None:
    table = ["| pass | order | bytes received / sample (none → filtered) | samples/s (none → "
             "filtered) | objective at the end (none → filtered) |", "|---|---|---|---|---|"]
    for r in rows:
        none, kept = r["none"], r["filtered"]
        table.append(
            f"| {r['pass']} | {' then '.join(r['order'])} | "
            f"{none['bytes_received_per_sample']:.1f} → {kept['bytes_received_per_sample']:.1f} | "
            f"{none['samples_per_s']:,.0f} → {kept['samples_per_s']:,.0f} | "
            f"{none['objective_last']:.4f} → {kept['objective_last']:.4f} |")

    def said(metric: str) -> str:
        one = summary[metric]
        between = "" if one["low"] is None else f" [{one['low']:.3f}, {one['high']:.3f}]"
        return f"{one['ratio']:.3f}x{between}"

    body = "\n\n".join([
        C.paragraph(f"""`python bench/sparse_pull_filter.py`: `psctl launch {' '.join(COMMAND)}
            --max-seconds {budget:g}`, with `--pull-filter significant:{delta}` and without, in
            {len(rows)} passes alternating which goes first (every worker trains to the end of
            the budget; the same seed and data). Filtered / unfiltered (95 %, Student t over the
            passes' log ratios): bytes a worker receives per sample
            {said('bytes_received_per_sample')}, samples per second {said('samples_per_s')},
            the objective at the last evaluation {said('objective_last')}."""),
        "\n".join(table),
        C.machine_note(info),
        f"Raw: `bench/results/{NAME}.json`.",
    ])
    C.update_docs_section(TITLE, body)


if __name__ == "__main__":
    main()
