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


@pytest.fixture(scope="session", autouse=True)
def _sim_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every simulated run of the suite (and every psctl it starts) measures into a cache of
    its own, never the user's, with the wire's costs given: no test but the calibration's runs
    its real runs."""
    from tests.sim_costs import seeded_cache

    path = seeded_cache(tmp_path_factory.mktemp("sim") / "sim-calibration.json")
    os.environ["PSCTL_SIM_CACHE"] = str(path)


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


# A cap, so that a many-core machine does not start dozens of workers that each import torch.
_MOST_WORKERS = 4
# The slowest modules (seconds of work, measured on 2 cores), started first so that the last
# minutes of a parallel run are spent on short tests on both workers, not on one long module
# while the other worker idles. Only the order depends on this list, never what runs.
SLOW_FIRST = (
    "tests/test_studies.py", "tests/test_fault_tolerance_doc.py",
    "tests/integration/test_sync_models.py", "tests/integration/test_fault_tolerance.py",
    "tests/psctl/test_study_tune.py", "tests/test_readme.py",
    "tests/integration/test_slow_reader.py", "tests/integration/test_sandblaster.py",
    "tests/webui/test_compare_page.py", "tests/test_cluster_doc.py",
    "tests/integration/test_role_failures.py", "tests/integration/test_pipeline.py",
    "tests/integration/test_learning_runs.py", "tests/bench/test_sim_validation.py",
    "tests/test_docs_cli.py", "tests/test_studies_doc.py", "tests/psctl/test_study_pool.py",
    "tests/integration/test_ray_backend.py",
)


def _whole_tiers(config: pytest.Config) -> bool:
    """True when the run names no test file or test: the suite, a tier or a folder of it."""
    return all(Path(arg.split("::")[0]).is_dir() for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The suite and its tiers run on pytest-xdist workers, one per core, unless ``-n`` was given
    (``-n 0``: in this one process), xdist is missing or disabled (``-p no:xdist``), or the run
    names a file or a test (seconds: not worth starting workers). One worker more than cores
    was tried: the suite took as long (961 s against 957 s in a clean-clone CI here), since
    its time is CPU (each role process's start-up), and every worker makes the session's
    recorded runs again.

    The tests of one module stay on one worker (``--dist loadfile``): its module fixtures, such
    as one recorded run that every test reads, are then made once. (Not ``loadgroup``:
    pytest-xdist 3.8 marks a group in a node attribute that pytest 9.2 no longer reads.) Two
    integration tests side by side put 8-12 busy processes on 2 cores: the oversubscription
    every timeout and detector of psctl must hold under anyway."""
    option = config.option
    if not hasattr(option, "numprocesses") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # xdist is not loaded, or this is a worker already
    if option.numprocesses is not None or option.collectonly or getattr(option, "usepdb", False):
        return  # -n was given (-n 0 included)
    if not _whole_tiers(config):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(cores or 1, _MOST_WORKERS)
    if workers > 1:
        option.numprocesses = workers
        option.dist = "loadfile"
        option.loadscopereorder = False  # the order below, slowest integration modules first


def _launches(item: pytest.Item) -> bool:
    where = item.path.relative_to(REPO).as_posix()
    launches = LAUNCHING_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    return bool(launches) or any(where == m or where.startswith(m + "/") for m in PROCESS_MODULES)


def _order(item: pytest.Item) -> tuple[int, int]:
    where = item.path.relative_to(REPO).as_posix()
    if where in SLOW_FIRST:
        return (0, SLOW_FIRST.index(where))
    return (1, 0) if item.get_closest_marker("integration") else (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _launches(item):
            item.add_marker(pytest.mark.integration)
    items.sort(key=_order)  # stable: the collection's order within each class
