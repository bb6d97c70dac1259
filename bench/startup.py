"""Start-up of a local run, roles forked from the warm template against fresh processes.

Each pass runs ``psctl launch --dataset digits --workers 2 --servers 1 --epochs 1`` once with
the template (the default) and once with ``--no-template``, alternating which goes first, and
measures from the command's start: the first iteration's start (its ``started_at`` in the
database), the end of the command, and the CPU-seconds its processes used (the launcher's
children and theirs, waited for: ``resource.getrusage(RUSAGE_CHILDREN)``). ``python -c "import
torch"`` is timed in the same pass, as issue 43 measures against it.
Run: ``python bench/startup.py`` (3 passes, about a minute); ``--quick``: one pass.
Writes ``bench/results/startup.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _common as C

LAUNCH = ["--dataset", "digits", "--workers", "2", "--servers", "1", "--epochs", "1",
          "--no-live"]
TIMEOUT_S = 300.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(workdir: Path, template: bool) -> dict[str, Any]:
    db = workdir / f"{'template' if template else 'fresh'}-{time.time_ns()}.db"
    command = [sys.executable, "-m", "psctl", "launch", *LAUNCH,
               "--template" if template else "--no-template"]
    cpu_before = _children_cpu_s()
    began = time.time()
    done = subprocess.run(command, cwd=workdir, env=dict(os.environ, PSCTL_DB=str(db),
                                                         NO_COLOR="1"),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    ended = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    [(first,)] = C.query_db(db, "SELECT min(started_at) FROM iterations")
    return {"template": template, "first_iteration_s": float(first) - began,
            "command_s": ended - began, "cpu_s": _children_cpu_s() - cpu_before}


def import_torch_s() -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=TIMEOUT_S)
    return time.perf_counter() - began


def summarise(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"import_torch_s": C.median([p["import_torch_s"] for p in passes])}
    for name, flag in (("template", True), ("fresh", False)):
        runs = [r for p in passes for r in p["runs"] if r["template"] is flag]
        out[name] = {key: C.median([r[key] for r in runs])
                     for key in ("first_iteration_s", "command_s", "cpu_s")}
    out["first_iteration_ratio"] = (out["template"]["first_iteration_s"]
                                    / out["fresh"]["first_iteration_s"])
    return out


def _pass(workdir: Path, index: int) -> dict[str, Any]:
    order = (True, False) if index % 2 == 0 else (False, True)
    runs = [launch(workdir, template) for template in order]
    return {"import_torch_s": import_torch_s(), "runs": runs}


def _report(summary: dict[str, Any]) -> None:
    for name in ("template", "fresh"):
        row = summary[name]
        print(f"{name}: first iteration after {row['first_iteration_s']:.2f} s, command "
              f"{row['command_s']:.2f} s, {row['cpu_s']:.2f} CPU-s (medians)")
    print(f"python -c 'import torch': {summary['import_torch_s']:.2f} s; first iteration "
          f"template/fresh: {summary['first_iteration_ratio']:.2f}x")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one pass")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="psctl-startup-") as tmp:
        passes = [_pass(Path(tmp), index) for index in range(1 if args.quick else args.passes)]
    summary = summarise(passes)
    payload: dict[str, Any] = {"machine": C.machine_info(), "passes": passes,
                               "summary": summary}
    C.write_result("startup", payload)
    _report(summary)
    return payload


if __name__ == "__main__":
    main()
