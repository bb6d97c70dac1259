"""Start-up and memory of local runs: roles forked from the warm template against fresh processes.

Each pass launches ``psctl launch --dataset digits`` with 2 workers and 1 server (the default BSP,
as in issue 43's first acceptance; 20 epochs), 16 workers and 2 servers (20 epochs) and 128 workers
and 8 servers (16 s from the run's start: ``--max-seconds 16``; both ``--sync asp``): several
seconds of training each, so that memory is read while every process trains (the first iteration's
time does not depend on it), each with the template (the default) and with ``--no-template`` (each
role a fresh Python), alternating which goes first. 128 fresh workers are not run: at about 200 MB
of private memory each they need some 27 GB, more than this machine has (the reason for the
template). For each launch, from the command's start: the first iteration's start (its
``started_at`` in the database), the command's end, the CPU-seconds of every process it started,
and the memory of all its processes while they train: proportional (PSS, each shared page split
among its sharers) and resident (RSS) summed, read by this script from /proc for every process
under the launcher, every half second from the first iteration to the run's stop (of the readings
with the most processes, the largest sum kept). ``python -c "import torch"`` is timed at the start
of each pass (issue 43 measures against it); the machine settles 3 s before each launch.

Run: ``python bench/startup.py`` (3 passes, about ten minutes); ``--quick``: one pass, 2 and 16
workers. Writes ``bench/results/startup.json`` and the section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _common as C

# (workers, servers, extra flags); 128 fresh processes do not fit this machine's memory. The
# epochs make each run train several seconds (the first iteration's time does not depend on
# them), so that its memory is read while every process trains.
SIZES: tuple[tuple[int, int, tuple[str, ...]], ...] = (
    (2, 1, ("--epochs", "20")), (16, 2, ("--sync", "asp", "--epochs", "20")),
    (128, 8, ("--sync", "asp", "--epochs", "100", "--max-seconds", "16")))
# Before each launch: the last run's processes have ended, but the machine settles for a moment
# (their memory freed, the load of 137 processes gone).
SETTLE_S = 3.0
FRESH_MAX_WORKERS = 16
TIMEOUT_S = 600.0
MEMORY_EVERY_S = 0.5
TITLE = "Start-up: roles forked from the warm template (`bench/startup.py`)"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _memory(root: int) -> tuple[int, int, int]:
    """PSS and RSS summed over ``root`` and every process under it, and how many there are."""
    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, 0
    pss = rss = count = 0
    for process in processes:
        try:
            full = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss, rss, count = pss + full.pss, rss + full.rss, count + 1
    return pss, rss, count


def _first_iteration(db: Path) -> float | None:
    if not db.exists():
        return None
    try:
        [(first,)] = C.query_db(db, "SELECT min(started_at) FROM iterations")
    except sqlite3.Error:  # the recorder has not made its tables yet
        return None
    return None if first is None else float(first)


def _training(db: Path) -> bool:
    """Whether the run has started training and not yet been told to stop."""
    if _first_iteration(db) is None:
        return False
    try:
        [(stops,)] = C.query_db(db, "SELECT count(*) FROM events WHERE kind = 'stop'")
    except sqlite3.Error:
        return False
    return not stops


def launch(workdir: Path, workers: int, servers: int, extra: Sequence[str],
           template: bool) -> dict[str, Any]:
    db = workdir / f"{workers}-{'template' if template else 'fresh'}-{time.time_ns()}.db"
    command = [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers",
               str(workers), "--servers", str(servers), "--no-live", *extra,
               "--template" if template else "--no-template"]
    cpu_before = _children_cpu_s()
    began = time.time()
    process = subprocess.Popen(command, cwd=workdir, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1"))
    peak = (0, 0, 0)
    deadline = time.monotonic() + TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if _training(db):  # every process holds its share; once roles end, the rest hold more
            pss, rss, count = _memory(process.pid)
            peak = max(peak, (pss, rss, count), key=lambda m: (m[2], m[0]))
        time.sleep(MEMORY_EVERY_S)
    _, stderr = process.communicate(timeout=max(deadline - time.monotonic(), 1.0))
    ended = time.time()
    first = _first_iteration(db)
    if process.returncode != 0 or first is None:
        raise RuntimeError(f"{' '.join(command)} failed:\n{stderr[-2000:]}")
    return {"workers": workers, "servers": servers, "template": template,
            "first_iteration_s": first - began, "command_s": ended - began,
            "cpu_s": _children_cpu_s() - cpu_before, "pss_bytes": peak[0],
            "rss_bytes": peak[1], "processes": peak[2]}


def import_torch_s() -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=TIMEOUT_S)
    return time.perf_counter() - began


def _kinds(workers: int) -> tuple[bool, ...]:
    return (True, False) if workers <= FRESH_MAX_WORKERS else (True,)


def _pass(workdir: Path, index: int, sizes: Sequence[tuple[int, int, tuple[str, ...]]]
          ) -> dict[str, Any]:
    time.sleep(SETTLE_S)
    torch_s = import_torch_s()  # beside the 2-worker runs it is compared with
    runs = []
    for workers, servers, extra in sizes:
        kinds = _kinds(workers)
        for template in kinds if index % 2 == 0 else tuple(reversed(kinds)):
            time.sleep(SETTLE_S)
            runs.append(launch(workdir, workers, servers, extra, template))
    return {"import_torch_s": torch_s, "runs": runs,
            "order": "template first" if index % 2 == 0 else "fresh first",
            "machine": C.machine_info()}


_KEYS = ("first_iteration_s", "command_s", "cpu_s", "pss_bytes", "rss_bytes", "processes")


def summarise(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians per size and kind; the first iteration against ``import torch``; memory per
    worker added beyond the smallest run."""
    out: dict[str, Any] = {"import_torch_s": C.median([p["import_torch_s"] for p in passes]),
                           "sizes": {}}
    for workers in sorted({r["workers"] for p in passes for r in p["runs"]}):
        row: dict[str, Any] = {}
        for name, flag in (("template", True), ("fresh", False)):
            runs = [r for p in passes for r in p["runs"]
                    if r["workers"] == workers and r["template"] is flag]
            if runs:
                row[name] = {key: C.median([r[key] for r in runs]) for key in _KEYS}
        out["sizes"][str(workers)] = row
    smallest = min(int(w) for w in out["sizes"])
    for workers, row in out["sizes"].items():
        for kind in ("template", "fresh"):
            if kind in row and int(workers) > smallest and kind in out["sizes"][str(smallest)]:
                base = out["sizes"][str(smallest)][kind]["pss_bytes"]
                row[kind]["pss_per_added_worker_bytes"] = (
                    (row[kind]["pss_bytes"] - base) / (int(workers) - smallest))
        if "template" in row:
            row["first_iteration_over_import_torch"] = (
                row["template"]["first_iteration_s"] / out["import_torch_s"])
        if "template" in row and "fresh" in row:
            row["first_iteration_ratio"] = (row["template"]["first_iteration_s"]
                                            / row["fresh"]["first_iteration_s"])
    return out


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def _rows(summary: dict[str, Any]) -> list[str]:
    rows = ["| workers | roles | first iteration | whole command | CPU-seconds | PSS summed "
            "(RSS summed) | PSS per added worker |", "|---|---|---|---|---|---|---|"]
    for workers, row in summary["sizes"].items():
        for kind in ("template", "fresh"):
            if kind not in row:
                continue
            one = row[kind]
            added = one.get("pss_per_added_worker_bytes")
            rows.append(
                f"| {workers} | {'forked from the template' if kind == 'template' else 'fresh'}"
                f" | {one['first_iteration_s']:.2f} s | {one['command_s']:.2f} s | "
                f"{one['cpu_s']:.1f} | {_mib(one['pss_bytes'])} ({_mib(one['rss_bytes'])}, "
                f"{one['processes']:.0f} processes) | "
                f"{'-' if added is None else _mib(added)} |")
    return rows


def _docs(summary: dict[str, Any], passes: Sequence[dict[str, Any]]) -> str:
    two = summary["sizes"].get("2", {})
    ratio = two.get("first_iteration_over_import_torch")
    lines = [
        C.paragraph(__doc__.split("\n\n", 1)[1].split("Run:")[0] if __doc__ else ""),
        "", *_rows(summary), "",
        C.paragraph(
            f"`python -c \"import torch\"` took {summary['import_torch_s']:.2f} s (median of "
            f"{len(passes)}); the 2-worker run's first iteration came "
            + (f"{ratio:.2f}x that after the command's start (issue 43 asks for at most "
               "1.5x)." if ratio is not None else "(not run).")
            + " Medians of the passes; the PSS per added worker is the difference from the "
            "2-worker run of the same kind over the workers added."),
        "", C.machine_note(passes[0]["machine"]),
        "", "Reproduce: `python bench/startup.py`.",
    ]
    return "\n".join(lines)


def _report(summary: dict[str, Any]) -> None:
    for line in _rows(summary):
        print(line)
    print(f"python -c 'import torch': {summary['import_torch_s']:.2f} s")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one pass, 2 and 16 workers")
    parser.add_argument("--no-docs", action="store_true",
                        help="leave docs/benchmarks.md as it is")
    args = parser.parse_args(argv)
    sizes = SIZES[:2] if args.quick else SIZES
    with tempfile.TemporaryDirectory(prefix="psctl-startup-") as tmp:
        passes = [_pass(Path(tmp), index, sizes)
                  for index in range(1 if args.quick else args.passes)]
    summary = summarise(passes)
    payload: dict[str, Any] = {"machine": C.machine_info(), "passes": passes,
                               "summary": summary}
    C.write_result("startup", payload)
    if not args.no_docs:
        C.update_docs_section(TITLE, _docs(summary, passes))
    _report(summary)
    return payload


if __name__ == "__main__":
    main()
