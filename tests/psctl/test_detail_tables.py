"""``psctl runs show`` fits the width it is given (issue 42): ``COLUMNS=100`` gives lines of
at most 100 characters with every cell whole, ``--wide`` every column, and a file or pipe
without COLUMNS the whole table on lines that never wrap."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from engine.db import open_engine
from engine.db.queries import run_detail
from psctl.cli import app
from psctl.display import detail_view
from tests.psctl.recorded import recorded_run

CUT_NUMBER = re.compile(r"[0-9][0-9,.]*…")
EVERY_WORKER_HEADER = ("worker", "iterations", "compute", "push", "pull", "wait (idle)",
                       "idle %", "staleness mean", "staleness max", "samples/s", "lr scale mean",
                       "lr scale min-max", "push KB/it", "push reduction", "cache saved KB/it")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("detail") / "experiments.db"
    recorded_run(path, "a" * 32, "a-run-with-a-longish-name", stop={"target_accuracy": 0.97})
    return path


def show(db: Path, *args: str, columns: str | None) -> str:
    done = CliRunner().invoke(app, ["runs", "show", "@last", "--db", str(db), *args],
                              env={"COLUMNS": columns, "NO_COLOR": "1"})
    assert done.exit_code == 0, done.output
    return done.stdout


def header_row(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("┃ worker"))


@pytest.mark.parametrize("columns", [100, 80])
def test_runs_show_fits_columns_with_no_cell_cut(db: Path, columns: int) -> None:
    text = show(db, columns=str(columns))
    assert max(len(line) for line in text.splitlines()) <= columns, text
    assert not CUT_NUMBER.search(text), text
    words = " ".join(text.split())
    assert "not shown at this width:" in words and "--wide shows every column" in words
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == 4 + 3  # every worker and every evaluation, one line each
    assert "4,095,971" in text  # the widest number, whole


def test_on_a_terminal_100_wide_the_run_fits(db: Path) -> None:
    engine = open_engine(db, readonly=True)
    try:
        detail = run_detail(engine, "a" * 32)
    finally:
        engine.dispose()
    buffer = io.StringIO()
    Console(file=buffer, width=100, force_terminal=True, color_system=None).print(
        detail_view(detail))
    text = buffer.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert not CUT_NUMBER.search(text)
    assert "stops at 97 % test accuracy" in text  # the target, in percent


def test_wide_shows_every_column(db: Path) -> None:
    text = show(db, "--wide", columns="100")
    header = header_row(text)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == list(EVERY_WORKER_HEADER)
    assert len(header) > 100 and "not shown" not in text


def test_into_a_file_every_column_on_lines_that_never_wrap(db: Path) -> None:
    text = show(db, columns=None)
    header = header_row(text)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == list(EVERY_WORKER_HEADER)
    table = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert {len(line) for line in table[:8]} == {len(header)}  # one width: nothing wrapped
    # Each note is one line, however long.
    assert any(line.startswith("cache saved: the pull bytes") and line.endswith("none)")
               for line in text.splitlines())
