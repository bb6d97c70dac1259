"""docs/studies.md's example runs as written, in an empty folder: its study file, then each
command of its ``bash`` block in order; the reports land where the document says."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
DOC = (REPO / "docs" / "studies.md").read_text()


def test_the_documented_study_runs(tmp_path: Path) -> None:
    toml, tune = re.findall(r"```toml\n(.*?)```", DOC, flags=re.S)
    name = toml.partition("\n")[0].removeprefix("#").strip()
    (tmp_path / name).write_text(toml)
    (commands,) = re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)
    env = {**os.environ, "PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1",
           "COLUMNS": "200"}
    outputs = {}
    for line in filter(str.strip, commands.splitlines()):
        words = shlex.split(line)
        assert words[0] == "psctl", line
        done = subprocess.run([sys.executable, "-m", "psctl", *words[1:]], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=200, check=False)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        outputs[line] = done.stdout
    (tmp_path / "tuned.toml").write_text(toml + "\n" + tune)
    tuned = subprocess.run([sys.executable, "-m", "psctl", "study", "tuned.toml", "--dry-run"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=200,
                           check=False)
    assert tuned.returncode == 0, tuned.stderr
    assert ("tune (grid): 8 settings x 2 seeds per point (64 runs), then each point at its "
            "best: optimizer.lr, optimizer.momentum") in tuned.stdout
    listed = outputs[f"psctl study {name} --dry-run"].splitlines()
    assert listed[0] == "digits-sync: 4 points" and len(listed) == 5
    results = tmp_path / "results"
    smoke = json.loads((results / "digits-sync-smoke" / "summary.json").read_text())
    full = json.loads((results / "digits-sync" / "summary.json").read_text())
    assert smoke["smoke"] and [r["name"] for r in smoke["rows"]] == [
        "digits-sync-bsp-2", "digits-sync-asp-2"]
    assert full["complete"] and len(full["rows"]) == 4
    assert all(row["status"] == "finished" for row in smoke["rows"] + full["rows"])
    assert (results / "digits-sync" / "accuracy-time.png").is_file()
    compared = outputs["psctl compare --where study=digits-sync --where workers=2 --target 0.5"]
    assert compared.count("digits-sync-bsp-2") == 2  # the smoke run and the full one
