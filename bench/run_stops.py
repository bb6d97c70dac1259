"""How soon every process of a run ends once it is told to stop (issue 30's 10 s goal; the bound
lived in tests/integration/test_run_stops.py until issue 38 moved it here).
Each pass launches a digits run (``psctl launch --dataset digits --workers 2 --servers 1``, long
enough not to end by itself), waits until it trains, then does one deed and measures the time from
the deed until none of the launcher's processes runs (zombies count as ended):
- ``rm --force``: ``psctl runs rm <id> --force --yes``;
- ``row deleted``: the run's row deleted from the database behind its back;
- ``recorder refuses``: a trigger makes every iteration insert fail, as a full disk would;
- ``ctrl-c``: SIGINT to the launcher, as a terminal's Ctrl-C (goal 5 s).
Passes alternate the order of the deeds. A median past the goal is reported, not failed.
Run: ``python bench/run_stops.py`` (about a minute a pass); ``--quick`` does one pass.
Writes ``bench/results/run_stops.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _common as C

GOAL_S = 10.0
GUARD_S = 120.0  # a run that has not ended by then is recorded as not ended
TRAINING_GUARD_S = 120.0


def _env(db: Path) -> dict[str, str]:
    return dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    try:
        return C.query_db(db, sql, *args)
    except sqlite3.OperationalError:  # the recorder has not created the tables yet
        return []


def _await_training(db: Path) -> str:
    deadline = time.monotonic() + TRAINING_GUARD_S
    while time.monotonic() < deadline:
        if db.exists():
            rows = _rows(db, "SELECT id FROM runs WHERE iteration_count > 5")
            if rows:
                return str(rows[0][0])
        time.sleep(0.2)
    raise RuntimeError(f"the run in {db} did not train within {TRAINING_GUARD_S:.0f} s")


def _children(parent: int) -> list[int]:
    """Every process it started (the roles forked from its template too)."""
    try:
        return [child.pid for child in psutil.Process(parent).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _running(pid: int) -> bool:
    """Whether the pid is a process that has not ended (a zombie has; its parent reaps it)."""
    try:
        status: str = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return False
    return bool(status != psutil.STATUS_ZOMBIE)


def _rm_force(db: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "psctl", "runs", "rm", run_id[:8], "--force",
                             "--yes", "--db", str(db)], env=_env(db),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)


def _delete_row(db: Path, run_id: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    conn.close()


def _refuse_rows(db: Path, run_id: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON iterations "
                     "BEGIN SELECT RAISE(ABORT, 'the disk refuses'); END")
    conn.close()


def _ctrl_c(db: Path, run_id: str) -> None:
    """SIGINT to the launcher, as a terminal's Ctrl-C: the parent of the run's coordinator."""
    [(detail,)] = _rows(db, "SELECT detail FROM events WHERE run_id = ? AND kind = "
                            "'coordinator_listening'", run_id)
    launcher = psutil.Process(int(json.loads(detail)["pid"])).ppid()
    os.kill(launcher, signal.SIGINT)


DEEDS: dict[str, Callable[[Path, str], object]] = {
    "rm --force": _rm_force, "row deleted": _delete_row, "recorder refuses": _refuse_rows,
    "ctrl-c": _ctrl_c}
# Ctrl-C's own goal (tests/psctl/test_cli.py held it as a bound until issue 38).
GOALS_S = {"ctrl-c": 5.0}


def measure(deed: str, workdir: Path) -> dict[str, Any]:
    """One run, one deed: seconds until every process of the run ended (None past GUARD_S)."""
    db = workdir / f"{deed.replace(' ', '_').replace('-', '')}.db"
    launch = subprocess.Popen(
        [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers", "2",
         "--servers", "1", "--epochs", "500", "--no-live"], env=_env(db),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    helper: object = None
    try:
        run_id = _await_training(db)
        pids = [launch.pid, *_children(launch.pid)]
        began = time.monotonic()
        helper = DEEDS[deed](db, run_id)
        ended_s = None
        while time.monotonic() - began < GUARD_S:
            if not any(_running(pid) for pid in pids):
                ended_s = time.monotonic() - began
                break
            time.sleep(0.05)
        return {"deed": deed, "processes": len(pids), "ended_s": ended_s}
    finally:
        for process in (launch, helper):
            if isinstance(process, subprocess.Popen):
                if process.poll() is None:
                    process.kill()
                process.wait(15)


def summarise(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for deed in DEEDS:
        times = [r["ended_s"] for p in passes for r in p["runs"] if r["deed"] == deed]
        ended = [t for t in times if t is not None]
        med = C.median(ended) if ended else None
        goal = GOALS_S.get(deed, GOAL_S)
        out[deed] = {"median_s": med, "runs": len(times), "not_ended": len(times) - len(ended),
                     "goal_s": goal, "met": med is not None and med <= goal
                     and len(ended) == len(times)}
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one pass")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    passes = []
    order = list(DEEDS)
    with tempfile.TemporaryDirectory(prefix="psctl-run-stops-") as tmp:
        for index in range(1 if args.quick else args.passes):
            deeds = order if index % 2 == 0 else order[::-1]
            workdir = Path(tmp) / f"pass{index}"
            workdir.mkdir()
            passes.append({"runs": [measure(deed, workdir) for deed in deeds]})
    summary = summarise(passes)
    payload: dict[str, Any] = {"machine": C.machine_info(), "passes": passes,
                               "summary": summary}
    path = args.out or C.RESULTS / "run_stops.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    for deed, row in summary.items():
        verdict = "met" if row["met"] else "MISSED (reported, not failed)"
        median = "none ended" if row["median_s"] is None else f"{row['median_s']:.1f} s"
        print(f"{deed}: every process ended in {median} (median of {row['runs']}), "
              f"goal {row['goal_s']:.0f} s: {verdict}")
    return payload


if __name__ == "__main__":
    main()
