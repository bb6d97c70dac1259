"""Run management commands: ``runs rm``, ``runs tag``, ``export`` and ``config show``.

The CLI only reads the database; deleting and tagging go through ``engine.recorder``, the one
module that writes it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from engine.analysis.selection import UsageError, parse_pairs
from psctl import settings
from psctl.cliutil import DbOption, Handled, RunArgument, RunsArgument, err, fail, show
from psctl.compare_cli import compare_command

config_app = typer.Typer(rich_markup_mode=None, help="Show the settings psctl launch would use.",
                        no_args_is_help=True)


def register(app: typer.Typer, runs_app: typer.Typer) -> None:
    app.command("compare")(compare_command)
    app.command("export")(export_command)
    runs_app.command("rm")(runs_rm)
    runs_app.command("tag")(runs_tag)
    app.add_typer(config_app, name="config")


def runs_rm(
    runs: RunsArgument,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    force: Annotated[bool, typer.Option(help="also delete runs that are still running")] = False,
    db: DbOption = None,
) -> None:
    """Delete runs and everything recorded for them."""
    from engine.db import open_engine
    from engine.db.queries import resolve_run, run_summaries
    from engine.recorder import delete_runs

    path = settings.database_path(db)
    try:
        engine = open_engine(path, readonly=True)
        ids = list(dict.fromkeys(resolve_run(engine, run) for run in runs))
        chosen = run_summaries(engine, ids, crash_after_s=settings.crash_after_s())
        engine.dispose()
        live = [run for run in chosen if run.status == "running"]
        if live and not force:
            names = ", ".join(f"{run.id[:8]} ({run.name})" for run in live)
            raise UsageError(f"{names} still running; stop it first, or pass --force")
        listing = "\n".join(f"  {run.id}  {run.name}  {run.status}" for run in chosen)
        err.print(f"deleting {len(chosen)} run(s):\n{listing}", highlight=False)
        _confirm(yes)
        # A crashed run may still have processes (a hung coordinator): they go too.
        for run in chosen:
            if run.status in ("running", "crashed"):
                _stop(path, run.id)
        deleted = delete_runs(path, ids)
    except Handled as exc:
        raise fail(exc) from None
    err.print(f"deleted {deleted} run(s)", highlight=False)


def _stop(path: Path, run_id: str) -> None:
    """End the run's processes before its rows go, so that none runs on unrecorded."""
    import time

    from engine.stopping import stop_run

    began = time.monotonic()
    stopped = stop_run(path, run_id)
    if stopped:
        err.print(f"stopped run {run_id[:8]}: its {len(stopped)} process(es) ended in "
                  f"{time.monotonic() - began:.1f} s", highlight=False)


def _confirm(yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("not a terminal, so no one can confirm: pass --yes to delete")
    if not typer.confirm("delete them?", default=False, err=True):
        raise typer.Exit(settings.EXIT_ERROR)


def runs_tag(
    run: RunArgument,
    pairs: Annotated[list[str] | None, typer.Argument(help="KEY=VALUE tags to set")] = None,
    remove: Annotated[
        list[str] | None, typer.Option("--remove", help="tag KEY to remove (repeatable)")
    ] = None,
    db: DbOption = None,
) -> None:
    """Set or remove tags on a run; `psctl compare --where KEY=VALUE` selects by them."""
    from engine.db import open_engine
    from engine.db.queries import resolve_run
    from engine.recorder.admin import set_tags, tag_problem

    path = settings.database_path(db)
    try:
        values = dict(parse_pairs(pairs or [], "runs tag"))
        if not values and not remove:
            raise UsageError("give KEY=VALUE tags to set or --remove KEY")
        problem = tag_problem(values, remove or [])
        if problem is not None:
            raise UsageError(problem)
        engine = open_engine(path, readonly=True)
        run_id = resolve_run(engine, run)
        engine.dispose()
        set_tags(path, run_id, values, remove or [])
    except Handled as exc:
        raise fail(exc) from None
    err.print(f"tagged run {run_id[:8]}", highlight=False)


def _complete_format(incomplete: str) -> list[str]:
    from psctl.export import FORMATS

    return [name for name in FORMATS if name.startswith(incomplete)]


def export_command(
    run: RunArgument,
    fmt: Annotated[str, typer.Option("--format", help="csv, json or parquet",
                                     autocompletion=_complete_format)] = "csv",
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="folder to write [./psctl-export-<id>]")
    ] = None,
    db: DbOption = None,
) -> None:
    """Write every row of a run, one file per table (runs, iterations, evaluations, ...)."""
    from engine.db import open_engine
    from engine.db.queries import resolve_run
    from psctl.export import FORMATS, export_run

    try:
        if fmt not in FORMATS:
            raise UsageError(f"--format takes one of {', '.join(FORMATS)}, not {fmt!r}")
        engine = open_engine(settings.database_path(db), readonly=True)
        run_id = resolve_run(engine, run)
        folder = out_dir or Path(f"psctl-export-{run_id[:8]}")
        counts = export_run(engine, run_id, fmt, folder)
        engine.dispose()
    except Handled as exc:
        raise fail(exc) from None
    for table, rows in counts.items():
        typer.echo(str(folder / f"{table}.{fmt}"))
        err.print(f"  {table}: {rows} row(s)", highlight=False)


@config_app.command("show")
def config_show(
    config: Annotated[Path | None, typer.Option("--config", help="a TOML settings file")] = None,
    no_config: Annotated[
        bool, typer.Option("--no-config", help="ignore the project and user config files")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
) -> None:
    """Each setting psctl launch would use, its value and where it came from."""
    from engine.plan import build_config
    from psctl.configsources import explain, layers, merged_values

    try:
        stack = layers(config, no_config=no_config)
        rows = explain(stack, build_config(merged_values(stack), {}))
    except Handled as exc:
        raise fail(exc) from None
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from psctl.tables import Col, FitTable

    # Every column always: a row is read whole, however wide (never cut to the screen).
    show(FitTable([Col("key", "left"), Col("value", "left"), Col("source", "left")],
                  [(row["key"], json.dumps(row["value"]), row["source"]) for row in rows],
                  title="settings of psctl launch (flags override all of these)"))
