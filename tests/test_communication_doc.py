"""docs/communication.md: its config file is a valid psctl config, and its launch lines run as
written, on a slice of MNIST (``--train-limit``, one epoch: the document's own runs take 10
epochs each), with the direction of each claim checked on what they recorded."""

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
from tests.integration.support import query

DOC = (REPO / "docs" / "communication.md").read_text()
SLICE = ["--train-limit", "2048", "--epochs", "1", "--no-live"]


def _psctl(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "psctl", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _env(db: Path) -> dict[str, str]:
    return {**os.environ, "PSCTL_DB": str(db), "NO_COLOR": "1"}


def test_the_config_file_is_valid_and_sets_what_it_names(tmp_path: Path) -> None:
    (toml,) = re.findall(r"```toml\n(.*?)```", DOC, flags=re.S)
    path = tmp_path / "psctl.toml"
    path.write_text(toml)
    shown = _psctl(["config", "show", "--config", str(path), "--json"], _env(tmp_path / "x.db"))
    assert shown.returncode == 0, shown.stderr
    settings = {row["key"]: (row["value"], row["source"]) for row in json.loads(shown.stdout)}
    written = {f"comm.{key}": value for key, value in
               re.findall(r"^(\w+) = (.+)$", toml, flags=re.M)}
    assert written.keys() == {"comm.prune", "comm.error_feedback", "comm.momentum_correction"}
    for key, value in written.items():
        assert json.dumps(settings[key][0]) == value, key  # TOML and JSON spell these alike
        assert settings[key][1] != "default", key


def _launch_lines() -> list[list[list[str]]]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)
    return [[shlex.split(line) for line in block.splitlines() if line.strip()]
            for block in blocks]


def _run(words: list[str], tmp_path: Path, name: str) -> dict[str, float]:
    """One documented line on the slice; its per-iteration means."""
    assert words[:2] == ["psctl", "launch"], words
    if not (REPO.parent / "shared" / "data" / "mnist").is_dir():
        pytest.skip("the lines name ../shared/data/mnist, which is not beside this checkout")
    db = tmp_path / f"{name}.db"
    done = _psctl([*words[1:], *SLICE], _env(db))
    assert done.returncode == 0, (words, done.stderr)
    assert query(db, "SELECT status FROM runs") == [("finished",)]
    (row,) = query(db, "SELECT avg(push_bytes), avg(push_bytes_dense), avg(bytes_received) "
                       "FROM iterations")
    return dict(zip(("push", "dense", "received"), map(float, row), strict=True))


@pytest.mark.integration  # four real launches of 4 workers and 2 servers
def test_the_launch_lines_run_and_move_the_bytes_the_document_says(tmp_path: Path) -> None:
    (pruned, zstd), (plain, filtered) = _launch_lines()
    assert pruned[-1] == "topk:1%" and zstd[-2:] == ["--compress", "zstd"]
    assert plain[-1] == "../shared/data/mnist" and filtered[-1] == "significant:0.001"
    runs = {name: _run(words, tmp_path, name) for name, words in
            (("pruned", pruned), ("zstd", zstd), ("plain", plain), ("filtered", filtered))}
    print(json.dumps(runs, indent=1))
    # top-1 % pushes: about 50x fewer bytes than the dense pushes (49.8x in the document)
    assert runs["pruned"]["dense"] / runs["pruned"]["push"] > 40
    # zstd packs the same pushes smaller (0.844 of them in the document)
    assert runs["zstd"]["push"] < runs["pruned"]["push"]
    # an unfiltered pull is the whole model, 3.73 MB; the filter sends only what changed
    assert runs["plain"]["received"] == pytest.approx(3_729_912, rel=1e-3)
    assert runs["filtered"]["received"] < 0.5 * runs["plain"]["received"]
