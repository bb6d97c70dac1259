"""A killed and resumed run's samples/s against an uninterrupted run's (issue 42, acceptance 2).

Each pass launches the same digits run twice (``--epochs EPOCHS --checkpoint-every 5``, 2
workers, 1 server): once uninterrupted, once killed with SIGKILL of its launcher after
``--kill-after`` seconds of training (so at least one checkpoint is complete), then continued
with ``psctl resume``. Passes alternate which of the two goes first, so that a change of the
machine's load between them falls on both. Measured from ``psctl runs show --json``: each run's
samples/s (its training time leaves a resume's downtime out: engine/db/downtime.py), the
downtime span, and whether evaluation times and epochs ever went back. Reported: the ratio
resumed / uninterrupted per pass and its mean with a 95 % interval (Student t over the passes'
log ratios). The issue's bound: within 15 %.

Run: ``python bench/resume.py`` (about 2 minutes a pass; ``--passes N``, ``--quick`` for one).
Writes ``bench/results/resume.json`` and the "Resumed runs" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _common as C
from engine.analysis.intervals import paired_ratio

GUARD_S = 300.0
BOUND = 0.15


def _env(db: Path) -> dict[str, str]:
    return dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")


def _psctl(args: list[str], db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "psctl", *args], capture_output=True,
                          text=True, env=_env(db), timeout=GUARD_S, check=False)


def _launch_args(epochs: int, name: str) -> list[str]:
    return ["launch", "--dataset", "digits", "--workers", "2", "--servers", "1",
            "--epochs", str(epochs), "--checkpoint-every", "5", "--name", name, "--no-live"]


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    try:
        return C.query_db(db, sql, *args)
    except sqlite3.OperationalError:  # not created yet
        return []


def _trained_s(db: Path, name: str) -> float:
    rows = _rows(db, "SELECT max(i.ended_at) - min(i.started_at) FROM iterations i "
                     "JOIN runs r ON r.id = i.run_id WHERE r.name = ?", name)
    return float(rows[0][0]) if rows and rows[0][0] is not None else 0.0


def _checkpoints(db: Path, name: str) -> int:
    rows = _rows(db, "SELECT count(*) FROM events e JOIN runs r ON r.id = e.run_id "
                     "WHERE r.name = ? AND e.kind = 'checkpoint'", name)
    return int(rows[0][0]) if rows else 0


def _killed_and_resumed(db: Path, epochs: int, name: str, kill_after: float) -> dict[str, Any]:
    launcher = subprocess.Popen([sys.executable, "-m", "psctl", *_launch_args(epochs, name)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=_env(db))
    deadline = time.monotonic() + GUARD_S
    try:
        while (_trained_s(db, name) < kill_after or _checkpoints(db, name) < 1) \
                and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if launcher.poll() is not None:
            raise SystemExit(f"{name} ended before it could be killed: raise --epochs")
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    time.sleep(2.0)  # its roles die with the launcher
    done = _psctl(["resume", name, "--no-live"], db)
    if done.returncode != 0:
        raise SystemExit(f"psctl resume {name} failed: {done.stderr.strip()[-400:]}")
    return _measure(db, name)


def _uninterrupted(db: Path, epochs: int, name: str) -> dict[str, Any]:
    done = _psctl(_launch_args(epochs, name), db)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr.strip()[-400:]}")
    return _measure(db, name)


def _measure(db: Path, name: str) -> dict[str, Any]:
    shown = _psctl(["runs", "show", name, "--json"], db)
    detail = json.loads(shown.stdout)
    points = [(e["elapsed_s"], e["epoch"]) for e in detail["evaluations"]]
    return {
        "run_id": detail["summary"]["id"],
        "status": detail["summary"]["status"],
        "samples": detail["totals"]["samples"],
        "train_wall_s": detail["totals"]["wall_s"],
        "samples_per_s": detail["totals"]["samples_per_s"],
        "downtime_s": sum(span["seconds"] for span in detail.get("downtime", [])),
        "evaluations": len(points),
        "times_never_go_back": all(b[0] >= a[0] for a, b in itertools.pairwise(points)),
        "epochs_never_go_back": all(b[1] >= a[1] for a, b in itertools.pairwise(points)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--kill-after", type=float, default=8.0,
                        help="seconds of training before the launcher is killed")
    parser.add_argument("--quick", action="store_true", help="one pass")
    args = parser.parse_args()
    passes = 1 if args.quick else args.passes
    info = C.machine_info()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="psctl-resume-") as folder:
        db = Path(folder) / "experiments.db"
        for k in range(passes):
            order = ("clean", "resumed") if k % 2 == 0 else ("resumed", "clean")
            row: dict[str, Any] = {"pass": k, "order": list(order)}
            for which in order:
                name = f"{which}-{k}"
                row[which] = (_uninterrupted(db, args.epochs, name) if which == "clean" else
                              _killed_and_resumed(db, args.epochs, name, args.kill_after))
            rows.append(row)
            print(json.dumps(row), flush=True)
    ratio = paired_ratio({r["pass"]: r["clean"]["samples_per_s"] for r in rows},
                         {r["pass"]: r["resumed"]["samples_per_s"] for r in rows},
                         lower_is_better=False, better="faster", worse="slower")
    with_downtime = [r["resumed"]["samples"] / (r["resumed"]["train_wall_s"]
                                                 + r["resumed"]["downtime_s"])
                     / r["clean"]["samples_per_s"] for r in rows]
    summary = {
        "with_downtime": math.exp(statistics.fmean(math.log(x) for x in with_downtime)),
        "ratio": None if ratio is None else ratio.ratio,
        "low": None if ratio is None else ratio.low,
        "high": None if ratio is None else ratio.high,
        "within_bound": None if ratio is None else abs(ratio.ratio - 1) <= BOUND,
        "never_back": all(r["resumed"]["times_never_go_back"]
                          and r["resumed"]["epochs_never_go_back"] for r in rows),
    }
    C.write_result("resume", {"machine": info, "epochs": args.epochs,
                              "kill_after_s": args.kill_after, "passes": rows,
                              "summary": summary})
    _docs(rows, summary, info, args)
    print(json.dumps(summary))


def _docs(rows: list[dict[str, Any]], summary: dict[str, Any], info: dict[str, Any],
          args: argparse.Namespace) -> None:
    table = ["| pass | uninterrupted samples/s | resumed samples/s | ratio | downtime s |",
             "|---|---|---|---|---|"]
    for r in rows:
        clean, resumed = r["clean"]["samples_per_s"], r["resumed"]["samples_per_s"]
        table.append(f"| {r['pass']} | {clean:,.0f} | {resumed:,.0f} | {resumed / clean:.3f} "
                     f"| {r['resumed']['downtime_s']:.1f} |")
    interval = ("" if summary["low"] is None else
                f" [{summary['low']:.3f}, {summary['high']:.3f}]")
    body = "\n\n".join([
        C.paragraph(f"""`python bench/resume.py`: the same digits run ({args.epochs} epochs, 2
            workers, 1 server, `--checkpoint-every 5`) uninterrupted, and killed with SIGKILL of
            its launcher after {args.kill_after:g} s of training then continued with `psctl
            resume`, in {len(rows)} passes alternating which goes first. Samples/s from `runs
            show --json` (a resumed run's training time leaves its downtime out). Resumed /
            uninterrupted: {summary['ratio']:.3f}x{interval} (95 %, Student t over the passes'
            log ratios; the issue's bound is within 15 %). Evaluation times and epochs never
            went back: {'yes' if summary['never_back'] else 'NO'}."""),
        "\n".join(table),
        C.paragraph(f"""Counting the downtime (the training time of every view before issue 42),
            the same passes give {summary['with_downtime']:.3f}x: a resumed run looked slower
            for having been stopped."""),
        C.machine_note(info),
        "Raw: `bench/results/resume.json`.",
    ])
    C.update_docs_section("Resumed runs (bench/resume.py)", body)


if __name__ == "__main__":
    main()
