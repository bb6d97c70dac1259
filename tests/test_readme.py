"""Every command in the README is run here, as written (the MNIST one capped in time)."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.proctime import usable_cores
from tests.conftest import REPO
from tests.sim_costs import seeded_cache

README = (REPO / "README.md").read_text()
pytestmark = pytest.mark.timeout(300)


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_readme_starts_with_install_and_test_commands() -> None:
    first, second = _bash_blocks()[:2]
    assert "pip install -e . &&" in first and "psctl launch --dataset digits" in first
    assert "[dev]" not in first  # running needs no test tools
    install, tests = (part.strip() for part in second.split("&&"))
    assert install == ".venv/bin/pip install -e '.[dev]'"
    assert tests == ".venv/bin/python -m pytest -q"


def test_the_readme_gives_no_test_count_and_the_fault_lists_own() -> None:
    """A count of tests goes stale with the next test, so the README gives none; the number of
    deliberate faults it names is read from faults.toml here."""
    import tomllib

    assert not re.search(r"\d[\d,]* (in-process )?tests\b", README), "a test count in the README"
    faults = len(tomllib.loads((REPO / "tests" / "tooling" / "faults.toml").read_text())["fault"])
    assert f"each of {faults} deliberate faults" in README


def test_the_first_launch_needs_nothing_from_the_dev_extra() -> None:
    """What the first command installs (the project's dependencies) is enough to launch: no
    module of the project imports a package only the dev extra brings."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {_name(d) for d in project["dependencies"]}
    dev_only = {_name(d) for d in project["optional-dependencies"]["dev"]} - base
    imported = {"pytest", "pytest_timeout", "xdist", "hypothesis", "httpx", "mypy", "ruff",
                "pandas", "playwright", "ray"}
    assert {n.replace("-", "_") for n in dev_only} <= imported | {"pytest_xdist"}
    for path in [*REPO.glob("psctl/**/*.py"), *REPO.glob("engine/**/*.py"),
                 *REPO.glob("webui/**/*.py")]:
        text = path.read_text()
        for name in imported - {"ray"}:  # the Ray backend imports ray, behind its own extra
            assert not re.search(rf"^\s*(import|from) {name}\b", text, flags=re.M), \
                f"{path} imports {name}, which only the dev extra installs"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()


def _run_psctl(line: str, db: Path) -> subprocess.CompletedProcess[str]:
    args = shlex.split(line)
    assert args[0] == "psctl"
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "psctl", *args[1:]], capture_output=True,
                          text=True, env=env, timeout=280, check=False, cwd=REPO)


def test_readme_first_launch_command_trains(tmp_path: Path) -> None:
    launch = _bash_blocks()[0].split("&&")[-1].strip()
    done = _run_psctl(launch + " --no-live", tmp_path / "experiments.db")
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stderr
    # 2 workers, 1 server and the evaluator: crowded on fewer than 4 cores, and said so.
    assert ("busy processes" in done.stderr) == (usable_cores() < 4)


def test_readme_mnist_example_runs(tmp_path: Path, mnist_dir: Path) -> None:
    db = tmp_path / "experiments.db"
    lines = [line for line in _bash_blocks()[2].splitlines() if line.strip()]
    launch = lines[0].replace("../shared/data/mnist", str(mnist_dir))
    # The full run takes minutes; the test keeps its exact options and caps the time.
    # 15 s (counted from the coordinator's start) leaves a loaded 2-core machine time to fork
    # six roles from the template and load MNIST (a few seconds); a run that stops before its
    # first iteration is a failure.
    done = _run_psctl(launch + " --max-seconds 15 --no-live", db)
    assert done.returncode == 0, done.stderr
    for line in lines[1:]:
        shown = _run_psctl(line, db)
        assert shown.returncode == 0, shown.stderr
        assert "bsp" in shown.stdout
    # `runs show` lists the best evaluation, as the database has it (issue 13, acceptance 3).
    with sqlite3.connect(db) as conn:
        best, step = conn.execute("SELECT accuracy, step FROM evaluations "
                                  "ORDER BY accuracy DESC, at LIMIT 1").fetchone()
    rows = [[cell.strip() for cell in row.split("│")[1:-1]]
            for row in shown.stdout.splitlines() if row.startswith("│")]
    assert [str(step), f"{100 * best:.2f}%", "best"] in [[r[2], r[3], r[-1]] for r in rows
                                                        if len(r) == 6], shown.stdout


def test_readme_consistency_examples_run(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    block = next(b for b in _bash_blocks() if "--sync elastic" in b)
    for line in (line for line in block.splitlines() if line.strip()):
        extra = " --no-live" if line.startswith("psctl launch") else ""
        done = _run_psctl(line + extra, db)
        assert done.returncode == 0, (line, done.stderr)
        if line.startswith("psctl zipline replay"):
            assert "R = 30, predictor last" in done.stdout


def test_readme_simulation_examples_run(tmp_path: Path, mnist_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (block,) = [b for b in _bash_blocks() if "--backend sim" in b]
    launch, study = block.strip().splitlines()
    # As a reader runs it: the study finds MNIST through its own --data-dir (issue 37).
    monkeypatch.delenv("PSCTL_DATA_DIR", raising=False)
    if not (REPO.parent / "shared" / "data" / "mnist").is_dir():
        pytest.skip(f"the README's --data-dir ../shared/data: no MNIST there ({mnist_dir} is)")
    monkeypatch.setenv("PSCTL_SIM_CACHE", str(seeded_cache(tmp_path / "cache.json")))
    db = tmp_path / "experiments.db"
    done = _run_psctl(launch + " --no-live", db)
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        (workers,) = conn.execute("SELECT COUNT(DISTINCT worker) FROM iterations").fetchone()
        (kind,) = conn.execute("SELECT kind FROM events WHERE kind = 'simulated'").fetchone()
    assert workers == 64 and kind == "simulated"
    done = _run_psctl(study + f" --out {tmp_path / 'report'}", db)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "report" / "report.md").exists()
