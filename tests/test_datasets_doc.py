"""docs/datasets.md: its Python example runs and returns what its comments say, its shell lines
run as written (from the repository, beside ../shared), and its tables are the registry's."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.datasets import dataset_names, get_spec
from engine.datasets.registry import DatasetSpec
from tests.conftest import REPO
from tests.integration.support import query

DOC = (REPO / "docs" / "datasets.md").read_text()


def _block(language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)
    return str(block)


def test_the_python_example_returns_what_its_comments_say(mnist_dir: Path) -> None:
    code = _block("python")
    names = re.search(r"dataset_names\(\)\s+# (\[.*\])", code)
    assert names is not None
    assert dataset_names() == ast.literal_eval(names.group(1))
    scope: dict[str, Any] = {"data_dir": mnist_dir}
    exec(compile(code, "docs/datasets.md", "exec"), scope)  # the doc's own example
    assert isinstance(scope["get_spec"]("mnist"), DatasetSpec)
    # locate answers with the folder resolved (../shared may be a link)
    assert Path(scope["locate"]("mnist", mnist_dir)) == mnist_dir.resolve()
    data = scope["data"]
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_y.shape == (10000,)
    assert Path(data.source) == mnist_dir.resolve()


@pytest.mark.integration  # two real launches on MNIST
def test_the_shell_lines_run_from_the_repository(tmp_path: Path) -> None:
    if not (REPO.parent / "shared" / "data" / "mnist").is_dir():
        pytest.skip("the lines name ../shared/data, which is not beside this checkout")
    lines = [line for line in _block("sh").splitlines() if line.strip()]
    assert len(lines) == 2
    bin_dir = str(Path(sys.executable).parent)
    for number, line in enumerate(lines):
        db = tmp_path / f"{number}.db"
        env = {key: value for key, value in os.environ.items() if key != "PSCTL_DATA_DIR"}
        env.update(PSCTL_DB=str(db), NO_COLOR="1", PATH=bin_dir + os.pathsep + env["PATH"])
        done = subprocess.run(["bash", "-c", f"{line} --no-live"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=240, check=False)
        assert done.returncode == 0, (shlex.split(line), done.stderr)
        assert query(db, "SELECT status FROM runs") == [("finished",)]


def test_the_checksum_table_is_the_registry() -> None:
    rows = re.findall(r"^\| ([\w-]+) \| ([\w.-]+\.gz) \| (\d+) \| ([0-9a-f]{32}) \|$", DOC,
                      flags=re.M)
    expected = [(name, f.name, str(f.size), f.md5) for name in ("mnist", "fashion-mnist")
                for spec in [get_spec(name)] if spec.files is not None for f in spec.files.all()]
    assert rows == expected


def test_the_mirror_table_is_the_registry() -> None:
    for name in ("mnist", "fashion-mnist"):
        row = re.search(rf"^\| {name} \| (.*) \|$", DOC, flags=re.M)
        assert row is not None, name
        assert re.findall(r"`([^`]+)`", row.group(1)) == list(get_spec(name).mirrors)
