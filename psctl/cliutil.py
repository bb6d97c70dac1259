"""What the run-management commands share: consoles, option types, errors to exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, RenderableType

from engine.analysis.selection import UsageError
from engine.errors import PsctlError, RunNotFound
from psctl import settings

out = Console()
err = Console(stderr=True)
# Wider than any table psctl prints; a cap only so that measuring terminates quickly.
_PIPE_WIDTH = 10_000


def show(renderable: RenderableType, console: Console = out) -> None:
    """Print to a terminal at its width; into a file or a pipe at the renderable's natural
    width, since squeezing it to a nominal 80 columns would cut every value to "…"."""
    if console.is_terminal:
        console.print(renderable)
        return
    options = console.options.update_width(_PIPE_WIDTH)
    width = max(console.measure(renderable, options=options).maximum, console.width)
    Console(file=console.file, width=width, no_color=console.no_color, highlight=False,
            soft_wrap=False).print(renderable)


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
    if isinstance(exc, UsageError):
        return typer.Exit(settings.EXIT_USAGE)
    if isinstance(exc, RunNotFound):
        return typer.Exit(settings.EXIT_NOT_FOUND)
    return typer.Exit(settings.EXIT_ERROR)


Handled = (PsctlError, UsageError)
