"""The ``psctl`` command line (Typer). Data goes to stdout, messages to stderr."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from engine.errors import PsctlError, RunNotFound
from psctl import settings

app = typer.Typer(help="Parameter-server training runs: launch, watch, compare.",
                  no_args_is_help=True, add_completion=False)
runs_app = typer.Typer(help="List and inspect recorded runs.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

DbOption = Annotated[Path | None, typer.Option("--db", help="database file [env: PSCTL_DB; "
                                               "default ./experiments.db]")]
out = Console()
err = Console(stderr=True)


def _fail(exc: PsctlError) -> typer.Exit:
    err.print(f"[red]error:[/] {exc}", highlight=False)
    return typer.Exit(settings.EXIT_NOT_FOUND if isinstance(exc, RunNotFound)
                      else settings.EXIT_ERROR)


@app.command()
def launch(
    workers: Annotated[int | None, typer.Option(help="worker processes [4]")] = None,
    servers: Annotated[int | None, typer.Option(help="shard server processes [2]")] = None,
    sync: Annotated[str | None, typer.Option(help="consistency model: bsp or asp [bsp]")] = None,
    dataset: Annotated[str | None, typer.Option(
        help="mnist, fashion-mnist, or digits (bundled, offline) [mnist]")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="folder with the data set's IDX files [env: PSCTL_DATA_DIR]")] = None,
    epochs: Annotated[int | None, typer.Option(help="passes over the training set [10]")] = None,
    batch_size: Annotated[int | None, typer.Option(help="samples per worker iteration [64]")] =
        None,
    lr: Annotated[float | None, typer.Option(help="server learning rate [0.1]")] = None,
    momentum: Annotated[float | None, typer.Option(help="server SGD momentum [0.9]")] = None,
    seed: Annotated[int | None, typer.Option(help="seed for initialisation and shuffling [0]")] =
        None,
    overlap: Annotated[bool | None, typer.Option(
        "--overlap/--no-overlap", help="asp: prefetch the next pull during compute")] = None,
    train_limit: Annotated[int | None, typer.Option(
        help="use only the first N training samples")] = None,
    eval_interval: Annotated[float | None, typer.Option(
        help="evaluate at least every S seconds [10]")] = None,
    target_accuracy: Annotated[float | None, typer.Option(
        help="stop once the test accuracy reaches A (0-1)")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="stop after S seconds")] = None,
    name: Annotated[str | None, typer.Option(help="a name for the run")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="TOML file with [cluster], [sync], [train], ... sections")] = None,
    db: DbOption = None,
    live: Annotated[bool, typer.Option(help="show live progress")] = True,
) -> None:
    """Train a model on shard servers and workers started on this machine, recording the run."""
    from psctl.launch import print_summary, resolve_config, run_launch

    overrides = {
        "name": name, "cluster.workers": workers, "cluster.servers": servers,
        "sync.model": sync, "data.dataset": dataset,
        "data.data_dir": str(data_dir) if data_dir else None, "data.train_limit": train_limit,
        "train.epochs": epochs, "train.batch_size": batch_size, "train.seed": seed,
        "train.overlap": overlap, "optimizer.lr": lr, "optimizer.momentum": momentum,
        "eval.interval_s": eval_interval, "stop.target_accuracy": target_accuracy,
        "stop.max_seconds": max_seconds,
    }
    path = settings.database_path(db)
    started = time.time()
    try:
        resolved = resolve_config(config, overrides)
        result = run_launch(resolved, path, err, live=live)
        print_summary(result, path, err, started)
    except PsctlError as exc:
        raise _fail(exc) from None
    codes = {"finished": settings.EXIT_OK, "interrupted": settings.EXIT_INTERRUPTED}
    raise typer.Exit(codes.get(result.status.value, settings.EXIT_ERROR))


@runs_app.command("ls")
def runs_ls(
    status: Annotated[str | None, typer.Option(help="only runs with this status")] = None,
    limit: Annotated[int | None, typer.Option(help="at most N runs")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    db: DbOption = None,
) -> None:
    """List recorded runs, newest first."""
    from engine.db import open_engine
    from engine.db.queries import list_runs
    from psctl.display import runs_table

    try:
        engine = open_engine(settings.database_path(db), readonly=True)
        runs = list_runs(engine, status=status, limit=limit)
    except PsctlError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps([run.to_dict() for run in runs], indent=2))
    else:
        out.print(runs_table(runs))


@runs_app.command("show")
def runs_show(
    run: Annotated[str, typer.Argument(help="run id, unique id prefix, name, @last or @last~N")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    db: DbOption = None,
) -> None:
    """Show one run: status, config, per-worker timings, idle time, staleness, evaluations."""
    from engine.db import open_engine
    from engine.db.queries import resolve_run, run_detail
    from psctl.display import detail_view

    try:
        engine = open_engine(settings.database_path(db), readonly=True)
        detail = run_detail(engine, resolve_run(engine, run))
    except PsctlError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(detail.to_dict(), indent=2))
    else:
        out.print(detail_view(detail))


def main() -> None:
    app()
