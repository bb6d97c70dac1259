"""``psctl launch``: resolve the configuration, check it can run, start it, show it live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape

from engine.config import RunConfig, build_config
from engine.datasets import locate
from engine.db import open_engine
from engine.db.queries import progress
from engine.errors import PsctlError
from engine.launcher import Launcher, LaunchResult
from engine.roles.sampling import oversubscription, usable_cores
from psctl.display import fmt_pct, fmt_seconds, progress_view, status_text


def resolve_config(config_file: Path | None, overrides: dict[str, Any], *,
                   no_config: bool = False) -> RunConfig:
    """Defaults < user file < project file < --config < PSCTL_* env < flags (see
    psctl.configsources); the data set's location is checked and pinned here so that a missing
    file fails now, before any process starts, with a message saying what to do."""
    from psctl.configsources import layers, merged_values

    config = build_config(merged_values(layers(config_file, no_config=no_config)), overrides)
    data_dir = Path(config.data.data_dir) if config.data.data_dir else None
    source = locate(config.data.dataset, data_dir, allow_download=True)
    if source != "sklearn":
        pinned = config.data.model_copy(update={"data_dir": str(Path(source).resolve())})
        config = config.model_copy(update={"data": pinned})
    return config


def run_launch(config: RunConfig, db: Path, console: Console, *, live: bool) -> LaunchResult:
    launcher = Launcher(config, db=db)
    # A run name or path is the user's text, never markup: "[/x]" must print as itself.
    console.print(f"[bold]psctl[/] run [cyan]{launcher.run_id}[/] ({escape(launcher.name)}) → "
                  f"{escape(str(db))}", highlight=False)
    crowded = oversubscription(config.cluster.workers, config.cluster.servers, usable_cores())
    if crowded is not None:
        console.print(f"[yellow]warning:[/] {crowded}", highlight=False)
    launcher.start()
    if not live:
        return launcher.wait()
    engine = open_engine(launcher.db, readonly=True)
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as view:
            def tick() -> None:
                try:
                    snapshot = progress(engine, launcher.run_id)
                except PsctlError:
                    return  # the run row may not be committed yet
                view.update(progress_view(snapshot, epochs=config.train.epochs,
                                          iterations_per_epoch=None))

            result = launcher.wait(on_tick=tick)
        console.line()  # off a terminal, the last live frame ends without a newline
        return result
    finally:
        engine.dispose()


def print_summary(result: LaunchResult, db: Path, console: Console, started: float) -> None:
    from engine.db.queries import run_detail

    engine = open_engine(db, readonly=True)
    try:
        detail = run_detail(engine, result.run_id)
    finally:
        engine.dispose()
    run = detail.summary
    console.print(status_text(run.status), f"run {run.id} ({escape(run.name)})", highlight=False)
    console.print(f"  wall time {fmt_seconds(time.time() - started)}, {run.iterations} "
                  f"iterations, best test accuracy {fmt_pct(run.best_accuracy)}, final "
                  f"{fmt_pct(run.final_accuracy)}", highlight=False)
    if result.reason:
        console.print(f"  reason: {escape(result.reason)}", highlight=False)
    if result.failed_children:
        console.print(f"  processes that failed: {', '.join(result.failed_children)}; logs in "
                      f"{escape(str(result.logs))}", style="red", highlight=False)
    console.print(f"  details: psctl runs show {run.id[:8]}", highlight=False)
