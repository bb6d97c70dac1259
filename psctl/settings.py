"""Where things are: the database path and exit codes shared by every command."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DB = Path("experiments.db")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 4
EXIT_INTERRUPTED = 130


def database_path(option: Path | None) -> Path:
    """``--db`` over ``PSCTL_DB`` over ./experiments.db."""
    if option is not None:
        return option
    from_env = os.environ.get("PSCTL_DB")
    return Path(from_env) if from_env else DEFAULT_DB
