"""Tables that fit the width they are printed at: headings are shortened first, then whole
columns are put away, least important first, and a note names them. A cell is never cut ("3,7…")
nor wrapped over two lines, so a number is always read whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# Wider than any table psctl prints; a cap only so that measuring terminates quickly.
UNBOUNDED = 10_000
WIDE_HINT = "--wide shows every column"


@dataclass(frozen=True)
class Col:
    """One column: its heading, a shorter one for narrow screens, and how soon it is put away
    (0: never; the highest rank goes first)."""

    header: str
    justify: Literal["left", "right"] = "right"
    short: str | None = None
    rank: int = 0
    note: str | None = None  # what the column means, printed below the table while it shows


Cell = str | Text


def _width_of(cell: Text) -> int:
    return max((cell_len(line) for line in cell.plain.splitlines()), default=0)


class FitTable:
    """A table with a title above and notes below (prose, so that they wrap at the screen's
    width rather than at the table's), laid out for the width Rich gives it. Cells are plain
    text (a str is never read as markup: "[x]" in a run's name is itself)."""

    def __init__(self, columns: Sequence[Col], rows: Sequence[Sequence[Cell]], *,
                 title: str | None = None, notes: Sequence[str] = (),
                 row_styles: Sequence[str] | None = None, boxed: bool = True) -> None:
        self.columns = tuple(columns)
        self.rows = [tuple(Text(c) if isinstance(c, str) else c for c in row) for row in rows]
        self.title = title
        self.notes = tuple(notes)
        self.row_styles = tuple(row_styles) if row_styles is not None else ("",) * len(rows)
        self.boxed = boxed
        # Each column's widest cell, measured once: laying out tries many sets of columns.
        self._widths = [max((_width_of(row[i]) for row in self.rows), default=0)
                        for i in range(len(self.columns))]
        self._overheads: dict[int, int] = {}

    def _new_table(self) -> Table:
        return Table() if self.boxed else Table(box=None, pad_edge=False)

    def table(self, shown: Sequence[int], short: bool, *, fold: bool = False) -> Table:
        """The rich table of the columns ``shown`` (indices), with short headings or not; with
        ``fold``, cells too wide for their column go on over more lines (never cut)."""
        table = self._new_table()
        for index in shown:
            column = self.columns[index]
            table.add_column(self._header(index, short), justify=column.justify,
                             no_wrap=not fold, overflow="fold")
        for row, style in zip(self.rows, self.row_styles, strict=True):
            table.add_row(*(row[index] for index in shown), style=style)
        return table

    def _header(self, index: int, short: bool) -> str:
        column = self.columns[index]
        return column.short if short and column.short else column.header

    def layout(self, console: Console, width: int | None) -> tuple[list[int], bool]:
        """The columns to show and whether their headings are short, to fit ``width``."""
        shown = list(range(len(self.columns)))
        if width is None or self._width(console, shown, short=False) <= width:
            return shown, False
        # Least important first; of equals, the rightmost.
        order = sorted((i for i, c in enumerate(self.columns) if c.rank > 0),
                       key=lambda i: (-self.columns[i].rank, -i))
        for index in [None, *order]:
            if index is not None:
                shown.remove(index)
            if self._width(console, shown, short=True) <= width:
                break
        return shown, True

    def _width(self, console: Console, shown: Sequence[int], *, short: bool) -> int:
        """The table's natural width with the columns ``shown``."""
        content = sum(max(self._widths[i], cell_len(self._header(i, short))) for i in shown)
        return content + self._overhead(console, len(shown))

    def _overhead(self, console: Console, count: int) -> int:
        """What ``count`` columns add to their cells' width: padding and rules, as Rich
        measures them (on a table with one-character headings and no rows)."""
        if count not in self._overheads:
            table = self._new_table()
            for _ in range(count):
                table.add_column("x")
            options = console.options.update_width(UNBOUNDED)
            self._overheads[count] = Measurement.get(console, options, table).maximum - count
        return self._overheads[count]

    def shown_notes(self, shown: Sequence[int]) -> list[str]:
        """The table's notes, those of the columns shown, and which columns are not."""
        notes = [*self.notes, *dict.fromkeys(
            self.columns[i].note for i in shown if self.columns[i].note)]
        hidden = [c.header for i, c in enumerate(self.columns) if i not in shown]
        if hidden:
            notes.append(f"not shown at this width: {', '.join(hidden)} ({WIDE_HINT})")
        return [note for note in notes if note]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown, short = self.layout(console, options.max_width)
        # Narrower than the columns that always show: their cells fold, as a last resort.
        fold = self._width(console, shown, short=short) > options.max_width
        table = self.table(shown, short, fold=fold)
        if self.title:
            yield Text(self.title, style="italic")
        yield table
        for note in self.shown_notes(shown):
            yield Text(note, style="dim")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        every = list(range(len(self.columns)))
        prose = [cell_len(line) for text in (self.title or "", *self.shown_notes(every))
                 for line in text.splitlines()]
        essential = [i for i, c in enumerate(self.columns) if c.rank == 0]
        return Measurement(self._width(console, essential, short=True),
                           max(self._width(console, every, short=False), *prose, 0))
