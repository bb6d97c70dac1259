"""Where things are: the database path and exit codes shared by every command."""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import ConfigError

DEFAULT_DB = Path("experiments.db")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 4
EXIT_INTERRUPTED = 130

CRASH_ENV_VAR = "PSCTL_CRASH_AFTER_S"


class OptionError(ConfigError):
    """A value given on the command line that the run's settings refuse (``--workers 0``,
    ``--sync bogus``): a usage error, exit code EXIT_USAGE, where a config file's own bad value
    is an error (EXIT_ERROR). A ConfigError, so that every caller that reports those reports
    this too."""


def database_path(option: Path | None) -> Path:
    """``--db`` over ``PSCTL_DB`` over ./experiments.db."""
    if option is not None:
        return option
    from_env = os.environ.get("PSCTL_DB")
    return Path(from_env) if from_env else DEFAULT_DB


def crash_after_s() -> float:
    """Seconds without a heartbeat after which a ``running`` run reads as ``crashed``.

    ``PSCTL_CRASH_AFTER_S`` overrides the default (15 s), e.g. for tests or slow file systems.
    """
    from engine.db.queries import CRASH_AFTER_S

    raw = os.environ.get(CRASH_ENV_VAR)
    if not raw:
        return CRASH_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{CRASH_ENV_VAR}={raw!r} is not a positive number of seconds")
    return value
