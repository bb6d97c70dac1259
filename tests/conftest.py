"""Shared fixtures: where the real data sets are, and a guard against leaked processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()

# A test run started in the background (nohup, `cmd &` in a script) ignores SIGINT, and every
# process it starts inherits that: the Ctrl-C tests would wait out their timeouts. Python
# handles SIGINT in the processes started from here once this one no longer ignores it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The MNIST folder from ../shared/data, or from PSCTL_DATA_DIR."""
    for root in (Path(os.environ.get("PSCTL_DATA_DIR", SHARED_DATA)), SHARED_DATA):
        if (root / "mnist" / "train-images-idx3-ubyte.gz").exists():
            return root / "mnist"
    pytest.skip("MNIST not found in ../shared/data or PSCTL_DATA_DIR")


def psctl(*args: str, db: Path, timeout: float = 180, **kwargs: object) -> \
        subprocess.CompletedProcess[str]:
    env = dict(os.environ, PSCTL_DB=str(db), COLUMNS="160", NO_COLOR="1")
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-m", "psctl", *args], capture_output=True, text=True, env=env,
        timeout=timeout, check=False, **kwargs)
    return done


def psctl_in_process(*args: str, db: Path, cwd: Path | None = None,
                     env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """What :func:`psctl` returns, from the same Typer app called in this process: a fraction
    of a second instead of an interpreter start per case. An exception that escapes the app is
    appended to stderr as the traceback a real ``python -m psctl`` would print."""
    from typer.testing import CliRunner

    from psctl.cli import app

    env = {"PSCTL_DB": str(db), "COLUMNS": "160", "NO_COLOR": "1", **(env or {})}
    with contextlib.chdir(cwd or Path.cwd()):
        result = CliRunner().invoke(app, list(args), env=env, prog_name="psctl")
    stderr = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
        code = 1
    return subprocess.CompletedProcess(["psctl", *args], code, result.stdout, stderr)


@pytest.fixture(scope="session")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("seeded") / "experiments.db"
    done = psctl("launch", "--dataset", "digits", "--workers", "2", "--servers", "1",
                 "--epochs", "2", "--name", "seed-run", "--no-live", db=db)
    assert done.returncode == 0, done.stderr
    return db


# Fixtures that launch real runs, and test modules that start processes or a browser themselves:
# every test using one is marked `integration`, so `pytest -m "not integration"` is the fast tier.
LAUNCHING_FIXTURES = frozenset({"seeded_db", "compare_db", "writable_db", "elastic_db", "runs"})
PROCESS_MODULES = frozenset({
    "tests/integration", "tests/test_readme.py", "tests/test_docs_cli.py",
    "tests/webui/test_browser.py", "tests/webui/test_launch_ui.py", "tests/psctl/test_cli.py",
    "tests/psctl/test_crashed.py", "tests/psctl/test_pager.py", "tests/webui/test_ui_lifecycle.py",
})


FAST_TIER = "not integration"
# A cap, so that a many-core machine does not start dozens of workers that each import torch.
_MOST_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The fast tier (``-m "not integration"``) runs on pytest-xdist workers, one per core, unless
    ``-n`` was given or xdist is missing or disabled (``-p no:xdist``). Only the fast tier:
    its tests share no ports, processes or files, while an integration test starts 4-6
    processes of its own, which are better not doubled on a small machine. ``-n 0`` runs the
    fast tier in this one process."""
    option = config.option
    if getattr(option, "markexpr", "") != FAST_TIER or not hasattr(option, "numprocesses"):
        return  # not the fast tier, or xdist is not loaded
    if option.numprocesses is not None or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # -n was given (-n 0 included), or this is a worker already
    if option.collectonly or getattr(option, "usepdb", False):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(cores or 1, _MOST_WORKERS)
    if workers > 1:
        option.numprocesses = workers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(REPO).as_posix()
        launches = LAUNCHING_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if launches or any(where == m or where.startswith(m + "/") for m in PROCESS_MODULES):
            item.add_marker(pytest.mark.integration)
