"""Every example in docs/cli.md is run here, as written, in document order, in an empty folder.

``toml`` blocks whose first line is ``# FILE`` are written to FILE when they are reached, so the
configuration examples read the file the document shows.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from typer.testing import CliRunner

from psctl.cli import app
from tests.conftest import REPO

DOC = (REPO / "docs" / "cli.md").read_text()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


class Result(NamedTuple):
    code: int
    stdout: str
    stderr: str


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(bash|toml)\n(.*?)```", DOC, flags=re.S)


def _run(line: str, env: dict[str, str]) -> Result:
    words = shlex.split(line, comments=True)
    extra = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        extra[key] = value
    assert words[0] == "psctl", line
    args = words[1:]
    if args[0] != "launch":  # the read commands run in-process: no interpreter start each
        done = CliRunner().invoke(app, args, env={**env, **extra})
        return Result(done.exit_code, done.stdout, done.stderr)
    # A launch runs as a user would start it; the live view is for a person at a terminal.
    ran = subprocess.run([sys.executable, "-m", "psctl", *args, "--no-live"],
                         capture_output=True, text=True, env={**os.environ, **env, **extra},
                         timeout=240, check=False)
    return Result(ran.returncode, ran.stdout, ran.stderr)


def test_every_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1", "COLUMNS": "200",
           "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    ran: dict[str, Result] = {}
    for language, body in _blocks():
        if language == "toml":
            first, _, _ = body.partition("\n")
            (tmp_path / first.removeprefix("#").strip()).write_text(body)
            continue
        for line in filter(str.strip, body.splitlines()):
            done = _run(line, env)
            assert done.code == 0, f"{line}\n{done.stderr}"
            ran[line] = done
    assert len(ran) >= 20
    shown = json.loads(ran["PSCTL_TRAIN__EPOCHS=5 psctl config show --json"].stdout)
    sources = {row["key"]: row["source"] for row in shown}
    assert sources["train.epochs"] == "env: PSCTL_TRAIN__EPOCHS"
    assert sources["cluster.workers"].startswith("project file:")
    assert (tmp_path / "bsp-parquet" / "iterations.parquet").is_file()
    assert "seconds of training" in ran["psctl compare bsp elastic --plot"].stdout
    grouped = ran["psctl compare --where group=bsp-x3 --target 0.5"].stdout
    assert "bsp-x3 (3 runs)" in grouped and grouped.count("±") >= 5
    per_run = ran["psctl compare --where group=bsp-x3 --target 0.5 --per-run"].stdout
    assert all(f"bsp-x3-seed{seed}" in per_run for seed in range(3))
