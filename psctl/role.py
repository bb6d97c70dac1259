"""``psctl role coordinator|server|worker|evaluator``: the join contract, for schedulers other
than psctl's own (Slurm, Kubernetes, a shell on each machine).

Every role is started by hand with where the coordinator listens (``PSCTL_COORDINATOR`` or
``--coordinator``), the run's secret (``PSCTL_TOKEN``) and, for servers and workers, its rank
(``PSCTL_RANK`` or ``--rank``). The coordinator takes every option of ``psctl launch``, records
the run in the database as psctl launch would, and waits for the announced servers, workers and
evaluator; if one never arrives, the run fails with a message that names it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from engine.analysis.selection import UsageError
from psctl import settings
from psctl.cliutil import DbOption, err
from psctl.cliutil import fail as _fail

role_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True, help=(
    "Start one role of a run by hand (Slurm, Kubernetes, a shell per machine): the join "
    "contract. See docs/cluster.md."))

HostOption = Annotated[str, typer.Option(
    help="this role's address: a server listens on it, and every role connects from it")]
CoordinatorOption = Annotated[str, typer.Option(
    envvar="PSCTL_COORDINATOR", show_envvar=True,
    help="HOST:PORT where the run's coordinator listens")]
RankOption = Annotated[int, typer.Option(envvar="PSCTL_RANK", show_envvar=True, min=0,
                                         help="this server's or worker's rank, from 0")]
TokenOption = Annotated[str | None, typer.Option(
    envvar="PSCTL_TOKEN", show_envvar=True, show_default=False,
    help="the run's secret (the environment keeps it out of ps: prefer PSCTL_TOKEN)")]
FrameOption = Annotated[int, typer.Option(help="largest frame accepted, bytes")]

TOKEN_HINT = ("set PSCTL_TOKEN to the run's secret, the same for every role (make one with "
              "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")


@role_app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def coordinator(
    ctx: typer.Context,
    host: HostOption = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535,
                                      help="port to listen on (0: any free one)")] = 0,
    join_timeout: Annotated[float | None, typer.Option(
        min=1, help="seconds the roles have to join, on top of 3 s per role "
        "(cluster.connect_timeout_s) [60]")] = None,
    token: TokenOption = None,
    db: DbOption = None,
) -> None:
    """Record a run and wait for its roles to join. Takes every option of psctl launch (the
    run's settings) after its own; prints PSCTL_COORDINATOR ws://HOST:PORT once it listens."""
    from engine.errors import PsctlError

    path = settings.database_path(db)
    try:
        config_path, run_id, name = _new_run(list(ctx.args), path, join_timeout)
    except PsctlError as exc:
        raise _fail(exc) from None
    err.print(f"psctl run {run_id} ({name}) → {path}; waiting for its roles to join",
              highlight=False, markup=False)
    code = _run_role(["coordinator", "--config", str(config_path), "--run-id", run_id,
                      "--name", name, "--db", str(path), "--host", host, "--port", str(port)],
                     token)
    _summary(path, run_id, config_path.parent)
    raise typer.Exit(code)


@role_app.command()
def server(coordinator: CoordinatorOption, rank: RankOption = 0,
           host: HostOption = "127.0.0.1", token: TokenOption = None,
           max_frame_bytes: FrameOption = 64 * 2**20) -> None:
    """A shard server: it listens on HOST and serves the key ranges the coordinator gives."""
    raise typer.Exit(_join("server", coordinator, rank, host, token, max_frame_bytes))


@role_app.command()
def worker(coordinator: CoordinatorOption, rank: RankOption = 0,
           host: HostOption = "127.0.0.1", token: TokenOption = None,
           max_frame_bytes: FrameOption = 64 * 2**20) -> None:
    """A worker: it trains on its part of the data set, pulling from and pushing to the
    servers."""
    raise typer.Exit(_join("worker", coordinator, rank, host, token, max_frame_bytes))


@role_app.command()
def evaluator(coordinator: CoordinatorOption, host: HostOption = "127.0.0.1",
              token: TokenOption = None, max_frame_bytes: FrameOption = 64 * 2**20) -> None:
    """The evaluator: it measures the servers' model on the test set."""
    raise typer.Exit(_join("evaluator", coordinator, 0, host, token, max_frame_bytes))


def _join(role: str, coordinator: str, rank: int, host: str, token: str | None,
          max_frame_bytes: int) -> int:
    address = coordinator if "://" in coordinator else f"ws://{coordinator}"
    return _run_role([role, "--coordinator", address, "--rank", str(rank), "--host", host,
                      "--max-frame-bytes", str(max_frame_bytes)], token)


def _run_role(argv: list[str], token: str | None) -> int:
    from engine.roles.__main__ import main

    if token:
        os.environ["PSCTL_TOKEN"] = token
    elif not os.environ.get("PSCTL_TOKEN") and not os.environ.get("PSCTL_CREDENTIAL"):
        raise _fail(UsageError(TOKEN_HINT))
    # Started by a scheduler or a shell, a role outlives neither on purpose: it ends when the
    # run does, not when its parent does.
    return main(argv, die_with_parent=False)


def _new_run(launch_args: list[str], db: Path, join_timeout: float | None
             ) -> tuple[Path, str, str]:
    """Parse psctl launch's options, record nothing yet, and write the run's config where
    psctl launch would (``psctl-logs/RUN`` beside the database)."""
    import json

    from engine.errors import ConfigError
    from engine.launcher import NewRun
    from psctl.launch_command import launch, prepare_database
    from psctl.launch_options import SectionedCommand, launch_config

    launch_app = typer.Typer(rich_markup_mode=None)
    launch_app.command(cls=SectionedCommand)(launch)
    try:
        options = typer.main.get_command(launch_app).make_context(
            "psctl role coordinator", launch_args).params
    except typer.TyperException as exc:
        format_message = getattr(exc, "format_message", None)
        message = format_message() if callable(format_message) else str(exc)
        raise ConfigError(f"{message} (psctl role coordinator takes psctl launch's "
                          "options)") from None
    if options.get("repeat", 1) != 1 or options.get("ui"):
        raise ConfigError("--repeat and --ui belong to psctl launch: a coordinator started by "
                          "hand records one run")
    config = launch_config(options, db)
    if join_timeout is not None:
        config = config.model_copy(update={"cluster": config.cluster.model_copy(
            update={"connect_timeout_s": join_timeout})})
    prepare_database(db)
    run = NewRun(config, db=db)
    run.logs.mkdir(parents=True, exist_ok=True)
    path = run.logs / "config.json"
    path.write_text(json.dumps(config.to_json_dict(), indent=2))
    return path, run.run_id, run.name


def _summary(db: Path, run_id: str, logs: Path) -> None:
    """How the run ended, as psctl launch says it."""
    from engine.db.queries import run_detail
    from engine.db.schema import open_engine
    from engine.errors import PsctlError
    from engine.launcher import LaunchResult
    from engine.wire.records import RunStatus
    from psctl.launch import print_summary

    try:
        engine = open_engine(db, readonly=True)
        try:
            detail = run_detail(engine, run_id)
        finally:
            engine.dispose()
        result = LaunchResult(run_id, RunStatus(detail.summary.status), detail.reason, logs)
        print_summary(result, db, err)
    except PsctlError as exc:
        err.print(f"the run's end could not be read: {exc}", highlight=False, markup=False)
