"""How long ``psctl --help`` and ``psctl launch --help`` take to print, and what they import.

Each pass runs both commands once, alternating which goes first, as fresh processes (the time
a user waits: interpreter start, imports, the help), and once more with ``-X importtime`` to
count the modules of the processes' code (engine.worker, engine.server, engine.roles) and of
torch, numpy and SQLAlchemy that they load: none since the policies are registered ``Lazy``
(issue 39: at most 0.5 s, median of 5).
Run: ``python bench/cli_help.py`` (5 passes, a few seconds); ``--quick``: one pass.
Writes ``bench/results/cli_help.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _common as C

COMMANDS = {"help": ["--help"], "launch_help": ["launch", "--help"]}
HEAVY = ("engine.worker", "engine.server", "engine.roles", "torch", "numpy", "sqlalchemy")
TIMEOUT_S = 60.0


def timed(args: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "psctl", *args], check=True, timeout=TIMEOUT_S,
                   capture_output=True)
    return time.perf_counter() - began


def heavy_imports(args: list[str]) -> list[str]:
    """The heavy modules ``psctl ARGS`` imports, read from ``-X importtime``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "psctl", *args],
                          check=True, timeout=TIMEOUT_S, capture_output=True, text=True)
    return heavy(done.stderr)


def heavy(importtime: str) -> list[str]:
    modules = [line.rsplit("|", 1)[-1].strip() for line in importtime.splitlines()
               if line.startswith("import time:") and "|" in line]
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def summarise(passes: Sequence[dict[str, float]]) -> dict[str, float]:
    return {name: C.median([p[name] for p in passes]) for name in COMMANDS}


def _pass(index: int) -> dict[str, float]:
    names = list(COMMANDS) if index % 2 == 0 else list(reversed(COMMANDS))
    return {name: timed(COMMANDS[name]) for name in names}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one pass")
    args = parser.parse_args(argv)
    passes = [_pass(index) for index in range(1 if args.quick else args.passes)]
    summary = summarise(passes)
    loaded = {name: heavy_imports(command) for name, command in COMMANDS.items()}
    payload: dict[str, Any] = {"machine": C.machine_info(), "passes": passes,
                               "summary": summary, "heavy_modules": loaded}
    C.write_result("cli_help", payload)
    for name, seconds in summary.items():
        print(f"psctl {' '.join(COMMANDS[name])}: {seconds:.3f} s (median of {len(passes)}); "
              f"heavy modules imported: {len(loaded[name])}")
    return payload


if __name__ == "__main__":
    main()
