"""``FitTable``: at any width the table shortens its headings, then puts whole columns away,
least important first, and names them; no cell is ever cut ("3,7…") or wrapped."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from psctl.tables import Col, FitTable

# A cell cut mid-number: a digit (or a separator inside a number) right before the ellipsis.
CUT_NUMBER = re.compile(r"[0-9][0-9,.]*…")

COLUMNS = (Col("worker"), Col("iterations", short="iters", rank=3), Col("compute"),
           Col("samples/s", short="smp/s", rank=1), Col("staleness max", short="st max", rank=4),
           Col("lr scale min-max", short="lr", rank=6, note="lr: what the servers applied"))
ROW = ("0", "3,712", "123.4 ms", "3,712,345", "17", "0.0625-0.25")


def render(table: FitTable, width: int) -> list[str]:
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=True, color_system=None).print(table)
    return buffer.getvalue().splitlines()


def cells(lines: list[str]) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines
            if line.startswith("│")]


@pytest.mark.parametrize("width", [200, 80, 60, 50, 40])
def test_every_line_fits_and_every_cell_is_whole(width: int) -> None:
    lines = render(FitTable(COLUMNS, [ROW, ROW], title="per worker"), width)
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    assert not CUT_NUMBER.search("\n".join(lines))
    for row in cells(lines):
        assert set(row) <= set(ROW), row  # each shown cell is one of the row's values, whole


def test_headings_are_shortened_before_any_column_goes() -> None:
    full = render(FitTable(COLUMNS, [ROW]), 200)
    assert "lr scale min-max" in full[1] and "not shown" not in "\n".join(full)
    width = max(len(line) for line in full)
    short = render(FitTable(COLUMNS, [ROW]), width - 1)
    assert "iters" in short[1] and "lr" in short[1]
    assert len(cells(short)[0]) == len(COLUMNS)


def test_the_least_important_columns_go_first_and_are_named() -> None:
    assert "lr: what the servers applied" in "\n".join(render(FitTable(COLUMNS, [ROW]), 200))
    lines = render(FitTable(COLUMNS, [ROW]), 40)
    text = " ".join(" ".join(lines).split())
    assert cells(lines)[0] == ["0", "123.4 ms", "3,712,345"]  # ranks 6, 4 and 3 went
    assert "not shown at this width: iterations, staleness max, lr scale min-max (--wide " \
        "shows every column)" in text
    assert "lr: what the servers applied" not in text  # a hidden column's note goes with it


def test_columns_ranked_0_are_never_put_away_nor_cut() -> None:
    # Narrower than the two columns that always show: their cells go on over two lines.
    lines = render(FitTable(COLUMNS, [ROW]), 16)
    assert max(len(line) for line in lines) <= 16
    assert "…" not in "\n".join(lines)
    folded = cells(lines)
    assert "".join(row[1] for row in folded).replace(" ", "") == "123.4ms"


def test_notes_and_title_are_prose_that_is_never_cut() -> None:
    table = FitTable(COLUMNS[:1], [ROW[:1]], title="a title " * 5,
                     notes=["a long note that explains the table " * 3])
    lines = render(table, 30)
    words = " ".join(" ".join(lines).split())
    assert ("a long note that explains the table " * 3).strip() in words
    assert max(len(line) for line in lines) <= 30


def test_measured_natural_width_holds_every_column() -> None:
    console = Console(width=40)
    table = FitTable(COLUMNS, [ROW])
    measured = console.measure(table, options=console.options.update_width(10_000))
    assert measured.maximum == max(len(line) for line in render(table, 10_000))
    assert measured.minimum < measured.maximum
