"""Shared fixtures: where the real data sets are, and a guard against leaked processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
    return subprocess.run([sys.executable, "-m", "psctl", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(REPO).as_posix()
        launches = LAUNCHING_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if launches or any(where == m or where.startswith(m + "/") for m in PROCESS_MODULES):
            item.add_marker(pytest.mark.integration)
