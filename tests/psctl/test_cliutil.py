"""``show``: terminal output fits the terminal (or COLUMNS); file and pipe output keeps every
value whole; messages into a file or pipe are never wrapped (issue 42)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from psctl.cliutil import Screen, accuracy, show
from psctl.tables import Col, FitTable

LONG = "elastic-w3s1-digits-20261123-042759"


def _table() -> Table:
    table = Table(title="runs")
    for header in ("id", "name", "status", "sync", "iterations", "best accuracy", "started"):
        table.add_column(header)
    table.add_row("3004ef51", LONG, "finished", "elastic", "72", "87.19%", "2026-11-23 04:27")
    return table


def test_into_a_pipe_the_table_keeps_its_natural_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    buffer = io.StringIO()
    show(_table(), Console(file=buffer, width=40))
    text = buffer.getvalue()
    assert LONG in text and "best accuracy" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 40


def test_on_a_terminal_the_table_fits_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    buffer = io.StringIO()
    show(_table(), Console(file=buffer, width=40, force_terminal=True, color_system=None))
    assert max(len(line) for line in buffer.getvalue().splitlines()) <= 40


def _fit_table() -> FitTable:
    return FitTable([Col("name", "left"), Col("samples/s"), Col("started", "left", rank=1)],
                    [(LONG, "3,712,345", "2026-11-23 04:27:59")], title="runs " * 20)


def test_columns_is_the_width_in_a_pipe_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    buffer = io.StringIO()
    show(_fit_table(), Console(file=buffer, width=200))
    lines = buffer.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 60 and "3,712,345" in buffer.getvalue()
    assert "started" in " ".join(" ".join(lines).split())  # named as not shown
    wide = io.StringIO()
    show(_fit_table(), Console(file=wide, width=200), wide=True)
    assert "2026-11-23 04:27:59" in wide.getvalue()


def test_the_pager_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    paged: list[str] = []
    monkeypatch.setattr("pydoc.pager", paged.append)
    monkeypatch.setattr("pydoc.getpager", lambda: paged.append)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("LESS", "-RS")  # as the pager is given it (and put back after)
    show(_fit_table(), Console(file=io.StringIO(), width=40), pager=True)
    assert paged == []
    show(_fit_table(), Console(file=io.StringIO(), width=40, force_terminal=True), pager=True)
    assert len(paged) == 1 and "2026-11-23 04:27:59" in paged[0]  # every column


def test_messages_into_a_file_stay_one_line() -> None:
    message = "a message longer than any terminal " * 8
    buffer = io.StringIO()
    Screen(file=buffer, width=80).print(message, highlight=False)
    assert buffer.getvalue() == message + "\n"
    terminal = io.StringIO()
    Screen(file=terminal, width=80, force_terminal=True, color_system=None).print(message)
    assert max(len(line) for line in terminal.getvalue().splitlines()) <= 80


@pytest.mark.parametrize(("given", "fraction"), [(0.97, 0.97), (97, 0.97), (1, 1.0), (100, 1.0),
                                                 (0.5, 0.5), (50, 0.5)])
def test_an_accuracy_is_a_fraction_or_a_percentage(given: float, fraction: float) -> None:
    assert accuracy(given) == pytest.approx(fraction)


@pytest.mark.parametrize("given", [0, -1, 100.01, 200, float("nan"), float("inf")])
def test_an_accuracy_past_100_percent_or_not_above_0_is_refused(given: float) -> None:
    from engine.analysis.selection import UsageError

    with pytest.raises(UsageError, match="is no accuracy: give a fraction"):
        accuracy(given)
