"""What the run-management commands share: consoles, option types, errors to exit codes."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType

from engine.analysis.selection import UsageError
from engine.errors import PsctlError, RunNotFound
from psctl import settings
from psctl.tables import UNBOUNDED


class Screen(Console):
    """A console whose messages wrap at a terminal's width and never off one: in a file or a
    pipe each message stays one line, however long (a nominal 80 columns would cut sentences
    in two)."""

    def print(self, *objects: Any, **options: Any) -> None:
        if options.get("soft_wrap") is None and not self.is_terminal:
            options["soft_wrap"] = True
        super().print(*objects, **options)


out = Screen()
err = Screen(stderr=True)


def screen_width(console: Console) -> int | None:
    """The width to lay tables out for: COLUMNS when set (a width asked for, in a file too),
    else the terminal's; None off a terminal (a file or a pipe: as wide as the table is)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return console.width if console.is_terminal else None


def show(renderable: RenderableType, console: Console = out, *, wide: bool = False,
         pager: bool = False) -> None:
    """Print at the screen's width (tables then choose their columns to fit it) or, ``wide``
    or off a terminal, at the renderable's natural width: nothing is cut or wrapped. A pager
    only when asked for and stdout is a terminal."""
    natural = console.measure(renderable, options=console.options.update_width(UNBOUNDED))
    if pager and console.is_terminal:
        _page(renderable, console, natural.maximum)
        return
    width = None if wide else screen_width(console)
    if width is None:
        width = max(natural.maximum, 1)
    if console.is_terminal and width == console.width:
        console.print(renderable)
        return
    Console(file=console.file, width=width, no_color=console.no_color, highlight=False,
            soft_wrap=False).print(renderable)


def _page(renderable: RenderableType, console: Console, width: int) -> None:
    # Every column, at full width: less -S scrolls sideways instead of folding each row.
    os.environ.setdefault("LESS", "-RS")
    paged = Console(width=max(width, 1), force_terminal=True, no_color=console.no_color)
    with paged.pager(styles=not console.no_color):
        paged.print(renderable)


def accuracy(value: float) -> float:
    """An accuracy given as a fraction (0.97) or in percent (97, any value above 1): the
    fraction. Past 100 %, or not above 0, is a UsageError."""
    if math.isnan(value) or not 0 < value <= 100:
        raise UsageError(f"{value:g} is no accuracy: give a fraction (0.97) or a percentage "
                         "(97), above 0 and at most 100")
    return value / 100 if value > 1 else value


def parse_accuracy(text: str) -> float:
    """typer's parser of an accuracy option (``--target-accuracy``, ``--target``): a bad value
    is a usage error (exit 2) that names the option."""
    try:
        return accuracy(float(text))
    except ValueError as exc:  # UsageError is one; float("x") raises another
        message = str(exc) if isinstance(exc, UsageError) else f"{text!r} is not a number"
        raise typer.BadParameter(message) from None


WideOption = Annotated[bool, typer.Option(
    "--wide", help="every column, however wide the terminal (a narrow one otherwise shows the "
    "most important columns and names the others)")]
PagerOption = Annotated[bool, typer.Option(
    "--pager/--no-pager", envvar="PSCTL_PAGER",
    help="show the table in a pager (less -S, or $PAGER) at full width; only on a terminal")]


def complete_run(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Shell completion for run arguments: ids and names from the database, newest first."""
    from engine.db import list_runs, open_engine

    try:
        engine = open_engine(settings.database_path(ctx.params.get("db")), readonly=True)
        try:
            runs = list_runs(engine, limit=200)
        finally:
            engine.dispose()
    except PsctlError:
        return []  # completion must never print an error into the user's command line
    found: list[tuple[str, str]] = [("@last", "the newest run")]
    for run in runs:
        found.append((run.id, f"{run.name} ({run.status})"))
        found.append((run.name, f"{run.id[:8]} ({run.status})"))
    unique: dict[str, str] = {}
    for value, help_text in found:
        if value.startswith(incomplete):
            unique.setdefault(value, help_text)  # a name shared by runs is offered once
    return list(unique.items())


DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="database file [env: PSCTL_DB; default ./experiments.db]"),
]
RunArgument = Annotated[
    str,
    typer.Argument(
        help="run id, unique id prefix, name, @last or @last~N", autocompletion=complete_run
    ),
]
RunsArgument = Annotated[
    list[str],
    typer.Argument(
        help="run ids, unique id prefixes, names, @last or @last~N", autocompletion=complete_run
    ),
]


def fail(exc: Exception) -> typer.Exit:
    """Report ``exc`` on stderr and choose the documented exit code."""
    # Soft wrap: a long message stays one line (the terminal folds it), so scripts and tests
    # read the same text at any width; markup=False because a message quoting a user's input
    # may hold brackets that Rich would otherwise take for (or choke on as) markup.
    err.print("[red]error:[/]", end=" ", highlight=False)
    err.print(str(exc), highlight=False, markup=False, soft_wrap=True)
    if isinstance(exc, UsageError | settings.OptionError):
        return typer.Exit(settings.EXIT_USAGE)
    if isinstance(exc, RunNotFound):
        return typer.Exit(settings.EXIT_NOT_FOUND)
    return typer.Exit(settings.EXIT_ERROR)


Handled = (PsctlError, UsageError)
