"""The ``psctl`` command line (Typer). Data goes to stdout, messages to stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from engine.analysis.selection import UsageError
from engine.errors import PsctlError
from psctl import policies, settings
from psctl.cliutil import (
    DbOption,
    Handled,
    PagerOption,
    RunArgument,
    WideOption,
    err,
    show,
)
from psctl.cliutil import fail as _fail
from psctl.launch_command import launch
from psctl.launch_options import SectionedCommand
from psctl.role import role_app

# engine.db.queries.SQLITE_INT_MAX, spelled out so that the CLI loads without the database
# layer: a larger --limit would overflow in the driver.
_SQLITE_INT_MAX = 2**63 - 1

# rich_markup_mode=None: help texts are plain text, so "[default]" and "[cluster]" are printed
# as written instead of being read (and dropped) as rich markup.
app = typer.Typer(rich_markup_mode=None,
                  help="Parameter-server training runs: launch, watch, compare.",
                  no_args_is_help=True, add_completion=True,
                  context_settings={"max_content_width": 120})
runs_app = typer.Typer(rich_markup_mode=None, help="List and inspect recorded runs.",
                       no_args_is_help=True)
app.add_typer(runs_app, name="runs")
zipline_app = typer.Typer(rich_markup_mode=None,
                          help="ElasticBSP's ZipLine barrier placement, offline.",
                          no_args_is_help=True)
app.add_typer(zipline_app, name="zipline")
app.add_typer(role_app, name="role")
app.command(cls=SectionedCommand)(launch)



@app.command()
def resume(
    run: RunArgument,
    db: DbOption = None,
    live: Annotated[bool, typer.Option(help="show live progress")] = True,
    data_dir: Annotated[Path | None, typer.Option(
        help="folder with the data set's files, when they moved since the run started [the "
        "folder the run used]", show_default=False)] = None,
) -> None:
    """Continue a failed, interrupted or crashed run from its newest complete checkpoint,
    under the same run id (launch it with --checkpoint-every SECONDS)."""
    from psctl.interrupts import stopping_signals
    from psctl.launch import print_summary, run_launch
    from psctl.resume import plan_resume, resumed_launcher, with_data_dir

    path = settings.database_path(db)
    try:
        config, point = plan_resume(path, run)
        config = with_data_dir(config, data_dir)
        err.print(f"resuming run {point.run_id[:8]} ({point.name}) from checkpoint "
                  f"{point.seq} in {point.checkpoint}", highlight=False, markup=False)
        with stopping_signals() as interruption:
            result = run_launch(config, path, err, live=live,
                                launcher=resumed_launcher(config, path, point))
            print_summary(result, path, err)
    except PsctlError as exc:
        raise _fail(exc) from None
    if result.status.value == "finished":
        raise typer.Exit(settings.EXIT_OK)
    raise typer.Exit(interruption.exit_code if result.status.value == "interrupted"
                     else settings.EXIT_ERROR)


@app.command()
def scale(
    run: RunArgument,
    workers: Annotated[int | None, typer.Option(
        help=policies.SCALE_WORKERS_HELP,
        min=1, max=256)] = None,
    servers: Annotated[int | None, typer.Option(
        help="the number of shard servers the job should have: newcomers take whole key "
        "ranges from the busiest servers, leavers hand theirs over first", min=1,
        max=64)] = None,
    db: DbOption = None,
) -> None:
    """Add workers or servers to a running job, or let some leave."""
    from psctl.scale import scale_run

    if workers is None and servers is None:
        raise _fail(UsageError("say how many --workers or --servers the job should have"))
    for role, count in (("workers", workers), ("servers", servers)):
        if count is None:
            continue
        try:
            answer = scale_run(settings.database_path(db), run, count, role=role)
        except PsctlError as exc:
            raise _fail(exc) from None
        if answer["kind"] == "scale_refused":
            raise _fail(PsctlError(str(answer.get("reason"))))
        err.print(f"scaling to {count} {role}: {_scale_change(role, answer)}",
                  highlight=False, markup=False)


def _scale_change(role: str, answer: dict[str, Any]) -> str:
    joining, leaving = answer.get("joining") or [], answer.get("leaving") or []
    names = "workers" if role == "workers" else "servers"
    if joining:
        return f"{names} {', '.join(map(str, joining))} join"
    if leaving:
        how = "after their iteration" if role == "workers" else "once their ranges moved"
        return f"{names} {', '.join(map(str, leaving))} leave {how}"
    return "nothing to change"


def _complete_status(incomplete: str) -> list[str]:
    from engine.db.queries import STATUSES

    return [status for status in STATUSES if status.startswith(incomplete)]


@runs_app.command("ls")
def runs_ls(
    status: Annotated[str | None, typer.Option(
        help="only runs with this status", autocompletion=_complete_status)] = None,
    limit: Annotated[int | None, typer.Option(
        min=0, max=_SQLITE_INT_MAX, help="at most N runs")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    wide: WideOption = False,
    pager: PagerOption = False,
    db: DbOption = None,
) -> None:
    """List recorded runs, newest first; a simulated run is marked (sim)."""
    from engine.db import open_engine
    from engine.db.queries import STATUSES, list_runs, quoted
    from psctl.display import runs_table
    from psctl.simulated import simulated_runs

    try:
        if status is not None and status not in STATUSES:
            raise UsageError(f"unknown run status {quoted(status)}; expected one of "
                             f"{', '.join(STATUSES)}")
        engine = open_engine(settings.database_path(db), readonly=True)
        runs = list_runs(engine, status=status, limit=limit,
                         crash_after_s=settings.crash_after_s())
        simulated = simulated_runs(engine, [run.id for run in runs])
    except Handled as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps([run.to_dict() | {"simulated": run.id in simulated}
                               for run in runs], indent=2))
    else:
        show(runs_table(runs, simulated), wide=wide, pager=pager)


@runs_app.command("show")
def runs_show(
    run: RunArgument,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    wide: WideOption = False,
    pager: PagerOption = False,
    db: DbOption = None,
) -> None:
    """Show one run: status, config, per-worker timings, idle time, staleness, evaluations."""
    from engine.db import open_engine
    from engine.db.queries import resolve_run, run_detail
    from psctl.display import detail_view

    try:
        engine = open_engine(settings.database_path(db), readonly=True)
        detail = run_detail(engine, resolve_run(engine, run),
                            crash_after_s=settings.crash_after_s())
    except PsctlError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(detail.to_dict(), indent=2))
    else:
        show(detail_view(detail), wide=wide, pager=pager)


@app.command("ui")
def ui_command(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="address to bind; 0.0.0.0 exposes the dashboard "
                                      "to the network")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to listen on")] = 8765,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="also answer requests that name the dashboard by this host name "
                             "(a reverse proxy's, say; repeatable; '*': any, which lets pages "
                             "from other sites reach it by DNS rebinding)")] = None,
) -> None:
    """Serve the live dashboard over the experiments database (read-only but for tags and
    notes). It answers only requests that name it by the host it is bound to (or 127.0.0.1,
    localhost, [::1]) and only same-origin writes and websockets."""
    from webui.server import listening_socket, serve

    path = settings.database_path(db)
    try:
        sock = listening_socket(host, port)
    except PsctlError as exc:
        raise _fail(exc) from None
    err.print(f"psctl dashboard on http://{host}:{sock.getsockname()[1]} over {path} "
              "(Ctrl-C stops it)", highlight=False, markup=False)
    serve(path, sock, allow=[host, *(allow_host or [])])


from psctl.commands import register  # noqa: E402  (compare, export, runs rm/tag, config)

register(app, runs_app)
from psctl.study_cli import register as register_study  # noqa: E402  (psctl study)

register_study(app)


def _complete_predictor(incomplete: str) -> list[str]:
    from engine.consistency.timings import PREDICTORS

    return [name for name in PREDICTORS if name.startswith(incomplete)]


@zipline_app.command("replay")
def zipline_replay(
    run: Annotated[str, typer.Argument(help="run id, unique id prefix, name, @last or @last~N")],
    lookahead: Annotated[int | None, typer.Option(
        min=1, max=10_000, help="R to replay with [the run's sync.lookahead, or 15]")] = None,
    predictor: Annotated[str | None, typer.Option(
        help="last or ewma [the run's sync.predictor, or ewma]",
        autocompletion=_complete_predictor)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    db: DbOption = None,
) -> None:
    """Replay a recorded run's timings: per sync, predicted vs actual end times, the wait
    ZipLine would choose and the wait actually observed. Tune R and the predictor from it."""
    from engine.analysis.replay import replay_run
    from engine.consistency.timings import PREDICTORS
    from engine.db import open_engine
    from engine.db.queries import quoted, resolve_run
    from psctl.replay_view import replay_summary, replay_table

    try:
        if predictor is not None and predictor not in PREDICTORS:
            raise UsageError(f"unknown predictor {quoted(predictor)} (known: "
                             f"{', '.join(PREDICTORS)})")
        engine = open_engine(settings.database_path(db), readonly=True)
        replay = replay_run(engine, resolve_run(engine, run), lookahead=lookahead,
                            predictor=predictor).to_dict()
    except Handled as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(replay, indent=2))
    else:
        show(replay_table(replay))
        show(replay_summary(replay))


def main() -> None:
    app(prog_name="psctl")
