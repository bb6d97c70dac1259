"""docs/simulation.md's commands run as written, in an empty folder; its claims about them hold:
the two runs' rows are identical, and runs show prints the line the document shows."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.sim_costs import seeded_cache

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
DOC = (REPO / "docs" / "simulation.md").read_text()


def _rows(db: Path, name: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        start = conn.execute("SELECT started_at FROM runs WHERE name = ?", (name,)).fetchone()[0]
        return [(*row[:-1], round(row[-1] - start, 6)) for row in conn.execute(
            "SELECT worker, iteration, compute_s, push_s, pull_s, wait_s, staleness, loss, "
            "bytes_sent, ended_at FROM iterations WHERE run_id = (SELECT id FROM runs WHERE "
            "name = ?) ORDER BY worker, iteration", (name,))]


def test_the_documented_commands_run_and_say_what_the_document_says(tmp_path: Path) -> None:
    commands = re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)[0]
    cache = seeded_cache(tmp_path / "cache.json")  # the wire's costs given: no real runs here
    env = {**os.environ, "PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1",
           "COLUMNS": "240", "PSCTL_SIM_CACHE": str(cache)}
    out = {}
    for line in filter(str.strip, commands.splitlines()):
        words = shlex.split(line)
        assert words[0] == "psctl", line
        extra = ["--no-live"] if words[1] == "launch" else []
        done = subprocess.run([sys.executable, "-m", "psctl", *words[1:], *extra],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=200, check=False)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        out[" ".join(words[1:3])] = done.stdout
    db = tmp_path / "experiments.db"
    first = _rows(db, "sim-ssp")
    assert len(first) == 8 * 3 * 3  # 1437 digits, 80 % to train, 8 workers: 3 batches an epoch
    assert first == _rows(db, "sim-ssp-again")
    assert len(_rows(db, "sim-this-machine")) == 4 * 5 * 6  # measured costs: it predicts
    (shown,) = re.findall(r"^simulated in virtual time: .*$", DOC, flags=re.M)
    assert shown in out["runs show"]
