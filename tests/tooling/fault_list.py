"""Does the fast tier still catch regressions? Apply each deliberate fault of faults.toml, one at a
time, to a scratch copy of the repository and run the fast tier there.

    python tests/tooling/fault_list.py              # the unmutated copy, then every fault
    python tests/tooling/fault_list.py --list       # the faults, one a line
    python tests/tooling/fault_list.py --only NAME  # one fault (repeatable), no baseline
    python tests/tooling/fault_list.py --baseline-only

A fault is caught when the fast tier fails on the mutated copy; that only means something if
the unmutated copy passes, so a full run checks it first (``--no-baseline`` skips it). The
working tree is never changed: the tracked files (as they are on disk, edits included; a new
test file must be `git add`ed to be in the copy) are copied to a temporary folder for each run.
Results go to bench/results/fault_list.json; runs of some faults only (``--only``) update their
entries and keep the others'.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FAULTS_FILE = Path(__file__).with_name("faults.toml")
REPORT = REPO / "bench" / "results" / "fault_list.json"
FAST_TIER = ("-m", "pytest", "-q", "-m", "not integration", "-x", "-p", "no:cacheprovider")
DEFAULT_TIMEOUT_S = 15 * 60
# pytest's exit codes: 1 some test failed, 2 a collection error (a fault that breaks an import
# fails the tier too); anything else (internal error, usage, nothing collected) is no verdict.
FAILED_CODES = (1, 2)


class FaultError(Exception):
    """A fault that cannot be applied, or a list that cannot be read."""


@dataclass(frozen=True)
class Fault:
    name: str
    area: str
    description: str
    file: str
    original: str
    replacement: str
    first: tuple[str, ...] = ()


_FIELDS = ("name", "area", "description", "file", "original", "replacement")


def load_faults(path: Path = FAULTS_FILE) -> list[Fault]:
    try:
        entries = tomllib.loads(path.read_text(encoding="utf-8")).get("fault", [])
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FaultError(f"cannot read the fault list {path}: {exc}") from None
    faults = []
    for number, entry in enumerate(entries, 1):
        missing = [f for f in _FIELDS if not isinstance(entry.get(f), str) or not entry[f]]
        if missing:
            raise FaultError(f"{path.name}: fault {number} lacks {', '.join(missing)}")
        name, area, description, file, original, replacement = (entry[f] for f in _FIELDS)
        faults.append(Fault(name, area, description, file, original, replacement,
                            tuple(entry.get("first", ()))))
    names = [f.name for f in faults]
    if len(set(names)) != len(names):
        raise FaultError(f"{path.name}: two faults share a name")
    return faults


def patched_text(root: Path, fault: Fault) -> str:
    """The fault's file under ``root`` with the fault in it; refuses unless the original text
    occurs exactly once (the code moved, or the patch would be ambiguous)."""
    target = root / fault.file
    try:
        text = target.read_text(encoding="utf-8")
    except OSError as exc:
        raise FaultError(f"fault {fault.name}: cannot read {fault.file}: {exc}") from None
    count = text.count(fault.original)
    if count != 1:
        raise FaultError(f"fault {fault.name}: its original text occurs {count} times in "
                         f"{fault.file} (must be exactly once): {fault.original!r}")
    return text.replace(fault.original, fault.replacement)


def apply_fault(root: Path, fault: Fault) -> None:
    (root / fault.file).write_text(patched_text(root, fault), encoding="utf-8")


def scratch_copy(destination: Path) -> Path:
    """The tracked files of the working tree, as they are on disk, under ``destination``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True, timeout=60).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def _environment(root: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    # tests/conftest.py looks for the data sets next to the checkout; the copy has none there.
    env.setdefault("PSCTL_DATA_DIR", str(REPO.parent / "shared" / "data"))
    return env


def run_fast_tier(root: Path, first: tuple[str, ...], timeout_s: float,
                  deselect: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fast tier in ``root``: the verdict, the exit code, the time and the failing tests.

    ``first`` (test files of the fast tier) run on their own before the rest: when they fail,
    the fast tier fails (they are part of it, selected alike), and minutes are saved. Only when
    they pass does the whole tier run. (pytest orders a file named before its folder by the
    folder's order, so naming it first would not run it first.)"""
    started = time.monotonic()
    ordered = [path for path in first if (root / path).is_file()]
    stage = "first files"
    run = _pytest(root, ordered, timeout_s, deselect) if ordered else None
    if run is None or run["verdict"] == "passed" or run["exit_code"] == 5:  # 5: none selected
        stage = "whole tier"
        run = _pytest(root, ["tests"], max(timeout_s - (time.monotonic() - started), 1.0),
                      deselect)
    return {**run, "stage": stage, "first": ordered,
            "seconds": round(time.monotonic() - started, 1)}


def _pytest(root: Path, paths: list[str], timeout_s: float,
            deselect: tuple[str, ...]) -> dict[str, Any]:
    skipped = [arg for node in deselect for arg in ("--deselect", node)]
    command = [sys.executable, *FAST_TIER, *skipped, *paths]
    with tempfile.TemporaryFile() as log:
        # Its own session, so that a run past its time is ended with everything it started.
        process = subprocess.Popen(command, cwd=root, env=_environment(root), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
            code = None
        log.seek(0)
        output = log.read().decode(errors="replace")
    verdict = ("timeout" if code is None else "failed" if code in FAILED_CODES
               else "passed" if code == 0 else "error")
    return {"verdict": verdict, "exit_code": code, "deselected": list(deselect),
            "failing": re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)[:5],
            "summary": _summary_line(output)}


def _summary_line(output: str) -> str:
    lines = [line.strip("= ") for line in output.splitlines() if line.startswith("=")]
    return next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)
                 or "error" in line), output.strip().splitlines()[-1] if output.strip() else "")


def run_one(fault: Fault | None, timeout_s: float,
            deselect: tuple[str, ...] = ()) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="psctl-fault-") as scratch:
        root = scratch_copy(Path(scratch))
        if fault is not None:
            apply_fault(root, fault)
        return run_fast_tier(root, fault.first if fault else (), timeout_s, deselect)


def fault_result(fault: Fault, run: dict[str, Any]) -> dict[str, Any]:
    outcome = {"failed": "caught", "passed": "missed"}.get(run["verdict"], run["verdict"])
    return {"name": fault.name, "area": fault.area, "file": fault.file,
            "description": fault.description, "result": outcome, **run}


def _tree_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False, timeout=60).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "edited": bool(git("status", "--porcelain"))}


def _previous_report() -> dict[str, Any]:
    try:
        report: dict[str, Any] = json.loads(REPORT.read_text(encoding="utf-8"))
        return report
    except (OSError, ValueError):
        return {}


def write_report(faults: list[Fault], results: list[dict[str, Any]],
                 baseline: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """The report, keeping earlier results of faults not run this time (and the earlier
    baseline when none ran), in the order of the list; only listed faults are kept."""
    previous = _previous_report()
    known = {r["name"]: r for r in previous.get("faults", [])} | {r["name"]: r for r in results}
    entries = [known[f.name] for f in faults if f.name in known]
    report = {
        "command": shlex.join(["python", *FAST_TIER, "tests"]),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "load_average_at_end": list(os.getloadavg()),
        **_tree_state(),
        "baseline": baseline if baseline is not None else previous.get("baseline"),
        "faults": entries,
        "caught": sum(r["result"] == "caught" for r in entries),
        "total": len(entries),
        "listed": len(faults),
        "seconds_this_run": round(seconds, 1),
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the faults and exit")
    parser.add_argument("--only", action="append", metavar="NAME", default=[],
                        help="run this fault only (repeatable); skips the baseline")
    parser.add_argument("--no-baseline", action="store_true",
                        help="do not run the unmutated copy first")
    parser.add_argument("--baseline-only", action="store_true",
                        help="run the unmutated copy only")
    parser.add_argument("--deselect", action="append", metavar="NODEID", default=[],
                        help="leave this test out of every run (repeatable; e.g. one that "
                             "fails on a loaded machine); the report lists it")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="time limit of one fast-tier run (default %(default)g)")
    return parser.parse_args(argv)


def _chosen(faults: list[Fault], names: list[str]) -> list[Fault]:
    unknown = sorted(set(names) - {f.name for f in faults})
    if unknown:
        raise FaultError(f"no fault named {', '.join(unknown)} (see --list)")
    return [f for f in faults if f.name in names] if names else faults


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        faults = load_faults()
        chosen = [] if args.baseline_only else _chosen(faults, args.only)
        if args.list:
            for fault in faults:
                print(f"{fault.name:32} {fault.area:14} {fault.description}")
            return 0
        for fault in chosen:  # all of them apply, before minutes are spent on any
            patched_text(REPO, fault)
    except FaultError as exc:
        print(f"fault_list: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    baseline = None
    if args.baseline_only or not (args.only or args.no_baseline):
        baseline = run_one(None, args.timeout, tuple(args.deselect))
        print(f"baseline (no fault): {baseline['verdict']} in {baseline['seconds']} s: "
              f"{baseline['summary']}", flush=True)
        if baseline["verdict"] != "passed":
            print("fault_list: the unmutated copy does not pass the fast tier; a fault's "
                  "verdict would mean nothing", file=sys.stderr)
            write_report(faults, [], baseline, time.monotonic() - started)
            return 1
    results = []
    for fault in chosen:
        results.append(fault_result(fault, run_one(fault, args.timeout,
                                                   tuple(args.deselect))))
        last = results[-1]
        print(f"{fault.name}: {last['result']} in {last['seconds']} s "
              f"{' '.join(last['failing'][:1]) or last['summary']}", flush=True)
    report = write_report(faults, results, baseline, time.monotonic() - started)
    print(f"caught {report['caught']} of {report['total']} "
          f"({len(results)} run now, {report['seconds_this_run']} s); {REPORT.relative_to(REPO)}")
    return 0 if report["caught"] == report["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
