"""``psctl compare``'s table (issue 42): into a file every column on lines that never wrap and
no pager; at a width it fits with every cell whole, the least important columns put away;
the target said in percent, given as 0.97 or as 97."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from psctl.cli import app
from tests.psctl.recorded import T0, recorded_run

CUT_NUMBER = re.compile(r"[0-9][0-9,.]*…")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compare-render") / "experiments.db"
    recorded_run(path, "a" * 32, "bsp-with-a-long-name", sync={"model": "bsp"},
                 optimizer={"lr": 0.05}, train={"batch_size": 32})
    recorded_run(path, "b" * 32, "asp-with-a-long-name", sync={"model": "asp"},
                 optimizer={"lr": 0.1}, train={"batch_size": 64}, started_at=T0 + 100)
    return path


@pytest.fixture
def no_pager(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way psctl could start a pager, recorded instead of started."""
    started: list[str] = []

    def pager(self: Any, *args: Any, **kwargs: Any) -> Any:
        started.append("pager")
        raise AssertionError("a pager was started")

    monkeypatch.setattr(Console, "pager", pager)
    monkeypatch.setattr("pydoc.pager", lambda text: started.append(text))
    return started


def compare(db: Path, *args: str, columns: str | None = None) -> Any:
    done = CliRunner().invoke(app, ["compare", "--db", str(db), *args],
                              env={"COLUMNS": columns, "NO_COLOR": "1", "PSCTL_PAGER": None})
    assert done.exit_code == 0, done.output
    return done


def test_into_a_file_no_line_wraps_and_no_pager_starts(db: Path, no_pager: list[str]) -> None:
    lines = compare(db, "@last~1", "@last", "--target", "0.97").stdout.splitlines()
    assert lines[0] == "2 run(s); to target: seconds of training to 97 % accuracy"
    table = lines[1:]
    # A top border, the header, its rule, a line per run and the bottom border: one width.
    assert len(table) == 6 and len({len(line) for line in table}) == 1, "\n".join(lines)
    header = [cell.strip() for cell in table[1].split("┃")[1:-1]]
    assert header[:2] == ["run", "name"] and "to target s" in header and "idle" in header
    assert "optimizer.lr" in header and "not shown" not in "\n".join(lines)
    assert no_pager == []


def test_asking_for_the_pager_off_a_terminal_starts_none(db: Path, no_pager: list[str]) -> None:
    assert "bsp-with-a-long-name" in compare(db, "--pager").stdout
    assert "bsp-with-a-long-name" in compare(db, "--pager", columns="60").stdout
    assert no_pager == []


@pytest.mark.parametrize("columns", [100, 80])
def test_at_a_width_the_table_fits_with_every_cell_whole(db: Path, columns: int) -> None:
    text = compare(db, "--target", "97", columns=str(columns)).stdout
    assert max(len(line) for line in text.splitlines()) <= columns, text
    assert not CUT_NUMBER.search(text) and "…" not in text
    words = " ".join(text.split())
    assert "not shown at this width:" in words and "(--wide shows every column)" in words
    for name in ("bsp-with-a-long-name", "asp-with-a-long-name"):  # names are never put away
        assert name in text


def test_wide_shows_every_column(db: Path) -> None:
    narrow = compare(db, "--target", "97", columns="80").stdout
    wide = compare(db, "--target", "97", "--wide", columns="80").stdout
    assert "not shown" not in wide and max(len(line) for line in wide.splitlines()) > 80
    assert compare(db, "--target", "97", columns=None).stdout == wide
    assert narrow != wide


def test_a_target_in_percent_is_the_same_target(db: Path) -> None:
    as_fraction = compare(db, "--target", "0.5", "--json").stdout
    assert compare(db, "--target", "50", "--json").stdout == as_fraction
    assert "seconds of training to 50 % accuracy" in compare(db, "--target", "50").stdout


def test_the_default_target_is_said_in_percent(db: Path) -> None:
    done = compare(db, "--baseline", "@last", "--json")
    assert "no --target given: time to target is the time to 97 % test accuracy" in done.stderr
