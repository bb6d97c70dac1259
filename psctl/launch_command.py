"""``psctl launch``'s command: its options and what it does with them. Its own module, so that
``psctl role coordinator``, which takes the same options, parses them without the whole CLI."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from engine.errors import PsctlError, StoreError
from psctl import settings
from psctl.cliutil import err
from psctl.cliutil import fail as _fail
from psctl.launch_options import launch_config, signature

if TYPE_CHECKING:
    from psctl.interrupts import Interruption


def launch(**options: Any) -> None:
    """Train a model on shard servers and workers started on this machine, recording the run."""
    path, repeat = settings.database_path(options["db"]), options["repeat"]
    if _may_fork_here(options["backend"]) and options["template"] is not False:
        from engine.hosts.template import start_early

        # It imports torch while this process imports the rest and checks the run's settings.
        start_early()
    from psctl.interrupts import stopping_signals
    from psctl.launch import repeats

    try:
        resolved = launch_config(options, path)
        group, configs = repeats(resolved, repeat) if repeat > 1 else (None, [resolved])
        prepare_database(path)
        dashboard = start_dashboard(path) if options["ui"] else None
        try:
            with stopping_signals() as interruption:
                results = _run_all(configs, group, path, live=options["live"],
                                   interruption=interruption)
            # The page is most useful once the run is over; a run stopped with Ctrl-C was
            # meant to stop everything.
            if dashboard is not None and results[-1].status.value != "interrupted":
                err.print(f"run ended; the dashboard stays at {dashboard.address}/runs/"
                          f"{results[-1].run_id} (Ctrl-C to stop)", highlight=False,
                          markup=False)
                dashboard.serve_until_signalled()
        finally:
            if dashboard is not None:
                dashboard.stop()
    except PsctlError as exc:
        raise _fail(exc) from None
    finally:
        from engine.hosts.template import discard_early

        discard_early()  # started early for a run that did not take it
    statuses = {result.status.value for result in results}
    if statuses == {"finished"}:
        raise typer.Exit(settings.EXIT_OK)
    raise typer.Exit(interruption.exit_code if "interrupted" in statuses
                     else settings.EXIT_ERROR)


# Typer reads the options from here: one per setting with a flag, and the few others.
launch.__signature__ = signature()  # type: ignore[attr-defined]


def _may_fork_here(backend: str | None) -> bool:
    """Whether the flag's backend (the configured default without one) runs its roles on this
    machine, where they may be forked from the template; a config file may still say otherwise,
    and the run then ends the template unused."""
    from engine.backends import BACKENDS, THIS_MACHINE
    from engine.config import ClusterConfig

    name = backend or str(ClusterConfig.model_fields["backend"].default)
    return name in BACKENDS and BACKENDS.can(name, THIS_MACHINE)


def _run_all(configs: list[Any], group: str | None, path: Path, *, live: bool,
             interruption: Interruption) -> list[Any]:
    """Each run in turn (one, or a group of repeated seeds); Ctrl-C (or SIGTERM, SIGHUP) ends
    the group."""
    from psctl.launch import print_group

    results: list[Any] = []
    try:
        _run_each(configs, group, path, live=live, results=results, interruption=interruption)
    except KeyboardInterrupt:  # between two runs of a group: none is running
        err.print("interrupted between runs; no run is left running", highlight=False)
        raise typer.Exit(interruption.exit_code) from None
    if group is not None and len(results) > 1:
        print_group(path, group, err)
    return results


def _run_each(configs: list[Any], group: str | None, path: Path, *, live: bool,
              results: list[Any], interruption: Interruption) -> None:
    from psctl.launch import command_started_at, print_summary, run_launch

    for index, one in enumerate(configs):
        tags = None if group is None else {"group": group}
        if group is not None:
            err.print(f"group {group}: run {index + 1} of {len(configs)}, seed "
                      f"{one.train.seed}", highlight=False, markup=False)
        try:
            # The first run's start-up counts from this command's start (the user's wait).
            requested_at = command_started_at() if index == 0 else None
            result = run_launch(one, path, err, live=live, tags=tags, requested_at=requested_at)
            print_summary(result, path, err)
        except KeyboardInterrupt:  # Ctrl-C again while the run stopped: it stops at once
            err.print("interrupted again while the run was stopping; its processes end with "
                      "this command", highlight=False)
            raise typer.Exit(interruption.exit_code) from None
        results.append(result)
        if result.status.value == "interrupted":
            break


def prepare_database(path: Path) -> None:
    """Create (or upgrade) the database before any process starts, so that an unusable path
    fails here, in one line, rather than in the coordinator or the log folder beside it."""
    from engine.db import open_engine

    if path.is_dir():
        raise StoreError(f"the experiments database {path} is a folder; give a file path")
    try:
        open_engine(path).dispose()
    except OSError as exc:  # creating its folder
        raise StoreError(f"cannot create the experiments database {path}: "
                         f"{exc.strerror or exc}") from None


def start_dashboard(db: Path) -> Any:
    from engine.errors import ConfigError
    from webui.server import DEFAULT_HOST, DEFAULT_PORT, BackgroundServer, port_taken

    try:
        server = BackgroundServer(db, DEFAULT_HOST, DEFAULT_PORT)
    except ConfigError as exc:
        if not port_taken(exc):
            raise
        # Another dashboard, most likely: any free port will do, said plainly.
        server = BackgroundServer(db, DEFAULT_HOST, 0)
        err.print(f"port {DEFAULT_PORT} is taken; the dashboard is at {server.address}/",
                  highlight=False, markup=False)
    try:
        address = server.start()
    except RuntimeError as exc:
        raise ConfigError(f"the dashboard did not start on {server.address}") from exc
    err.print(f"dashboard: {address}/runs/@last", highlight=False)
    return server
