"""``show``: terminal output fits the terminal; file and pipe output keeps every value whole."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from psctl.cliutil import show

LONG = "elastic-w3s1-digits-20261123-042759"


def _table() -> Table:
    table = Table(title="runs")
    for header in ("id", "name", "status", "sync", "iterations", "best accuracy", "started"):
        table.add_column(header)
    table.add_row("3004ef51", LONG, "finished", "elastic", "72", "87.19%", "2026-11-23 04:27")
    return table


def test_into_a_pipe_the_table_keeps_its_natural_width() -> None:
    buffer = io.StringIO()
    show(_table(), Console(file=buffer, width=40))
    text = buffer.getvalue()
    assert LONG in text and "best accuracy" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 40


def test_on_a_terminal_the_table_fits_its_width() -> None:
    buffer = io.StringIO()
    show(_table(), Console(file=buffer, width=40, force_terminal=True, color_system=None))
    assert max(len(line) for line in buffer.getvalue().splitlines()) <= 40
