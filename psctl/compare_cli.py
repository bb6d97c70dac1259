"""The ``psctl compare`` command: select runs, measure them, write one table, format or plot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from engine.analysis.selection import UsageError
from engine.analysis.table import DEFAULT_TARGET
from psctl import settings
from psctl.cliutil import (
    DbOption,
    Handled,
    PagerOption,
    WideOption,
    complete_run,
    err,
    fail,
    out,
    parse_accuracy,
)

if TYPE_CHECKING:  # the CLI imports these lazily, only when a command runs
    from sqlalchemy import Engine

    from engine.analysis.table import Comparison
    from engine.db.metrics import RunRecord

def compare_command(
    runs: Annotated[
        list[str] | None,
        typer.Argument(
            help="runs: id, unique id prefix, name, @last or @last~N [all runs]",
            autocompletion=complete_run,
            show_default=False,
        ),
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option("--where", help="keep runs whose config key, column or tag KEY=VALUE"),
    ] = None,
    target: Annotated[
        float | None,
        typer.Option(
            help="accuracy for the time-to-target column: a fraction (0.97) or a percentage "
            f"(97) [{DEFAULT_TARGET:.0%} where --baseline, --sort-by time_to_target or a group "
            "of repeated runs needs one]",
            show_default=False, parser=parse_accuracy,
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(help="run whose time to --target is speedup 1", autocompletion=complete_run),
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option("--all/--only-changed", help="every config key, or only those that differ"),
    ] = False,
    sort_by: Annotated[str | None, typer.Option(help="column to sort by, best first")] = None,
    top: Annotated[int | None, typer.Option(help="only the first N rows", min=0)] = None,
    plot: Annotated[bool, typer.Option("--plot", help="chart a metric against wall time")] = False,
    metric: Annotated[
        str, typer.Option(help="--plot metric: accuracy, loss, step or epoch; or a metric the "
                          "runs' code logged (psctl.log): plotted, or its columns in the table")
    ] = "accuracy",
    per_run: Annotated[bool, typer.Option(
        "--per-run", help="a row per run, also for runs of a group (launch --repeat); by "
        "default a group is one row of mean ± standard deviation")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout")] = False,
    as_md: Annotated[bool, typer.Option("--md", help="a Markdown table on stdout")] = False,
    wide: WideOption = False,
    pager: PagerOption = False,
    db: DbOption = None,
) -> None:
    """Compare runs side by side: differing config, accuracy, time to target, speedup, idle time."""
    from engine.analysis.compare import comparison_for, sorts_by_time_to_target
    from engine.analysis.selection import select_runs
    from engine.db import open_engine
    from psctl.display import fmt_target

    try:
        if sum((as_json, as_csv, as_md, plot)) > 1:
            raise UsageError("choose one of --json, --csv, --md and --plot")
        given = target
        if target is None and (baseline is not None or sorts_by_time_to_target(sort_by)):
            target = DEFAULT_TARGET
        engine = open_engine(settings.database_path(db), readonly=True)
        if plot:
            records = select_runs(engine, runs or [], where or [],
                                  crash_after_s=settings.crash_after_s())
            _print_plot(engine, records, metric)
            return
        table = comparison_for(engine, runs or [], where or [], target=target,
                               baseline=baseline, show_all=show_all, sort_by=sort_by, top=top,
                               per_run=per_run, crash_after_s=settings.crash_after_s(),
                               metric=metric)
    except Handled as exc:
        raise fail(exc) from None
    if given is None and table.target is not None:
        err.print(f"no --target given: time to target is the time to "
                  f"{fmt_target(table.target)} test accuracy", highlight=False)
    _write(table, as_json=as_json, as_csv=as_csv, as_md=as_md, wide=wide, pager=pager)


def _print_plot(engine: Engine, records: list[RunRecord], metric: str) -> None:
    from psctl.plot import plot, want_color

    color = want_color() and out.is_terminal
    typer.echo(plot(engine, records, metric=metric, width=min(out.width, 120), color=color))


def _write(table: Comparison, *, as_json: bool, as_csv: bool, as_md: bool, wide: bool,
           pager: bool) -> None:
    from psctl.compare_render import csv_text, json_text, markdown, print_table

    if as_json:
        typer.echo(json_text(table))
    elif as_csv:
        typer.echo(csv_text(table), nl=False)
    elif as_md:
        typer.echo(markdown(table), nl=False)
    else:
        print_table(table, out, wide=wide, pager=pager)
        if not table.rows:
            err.print("no runs to show", highlight=False)
