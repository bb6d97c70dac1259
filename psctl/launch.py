"""``psctl launch``: resolve the configuration, check it can run, start it, show it live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from engine.analysis.cells import fmt_seconds
from engine.backends import BACKENDS, THIS_MACHINE, RunHandle
from engine.budget import budget_of
from engine.config import RunConfig
from engine.datasets import describe, locate
from engine.datasets.sources import is_sparse_source, is_user_source
from engine.db import open_engine
from engine.db.queries import RunDetail, progress
from engine.errors import ConfigError, PsctlError
from engine.hosts.template import discard_early
from engine.keys import partition, ranges_needed
from engine.launcher import LaunchResult, default_run_name
from engine.models.device import check_here as check_device
from engine.models.spec import builtin_layout
from engine.plan import build_config, parse_config
from engine.proctime import usable_cores
from engine.roles.sampling import oversubscription
from psctl.display import (
    Plan,
    fmt_pct,
    fmt_target,
    progress_view,
    starting_view,
    status_text,
)
from psctl.learnopts import downpour_momentum_note, momentum_twice_note
from psctl.settings import OptionError


def resolve_config(config_file: Path | None, overrides: dict[str, Any], *,
                   no_config: bool = False) -> RunConfig:
    """Defaults < user file < project file < --config < PSCTL_* env < flags (see
    psctl.configsources); the data set's location is checked and pinned here so that a missing
    file fails now, before any process starts, with a message saying what to do."""
    from psctl.configsources import layers, merged_values

    config = compose(merged_values(layers(config_file, no_config=no_config)), overrides)
    data_dir = Path(config.data.data_dir) if config.data.data_dir else None
    source = locate(config.data.dataset, data_dir, allow_download=True)
    if BACKENDS.can(config.cluster.backend, THIS_MACHINE):  # a cluster's GPUs are on its nodes
        check_device(config.train.device)
    if source not in ("sklearn", "generated") and not is_user_source(config.data.dataset):
        pinned = config.data.model_copy(update={"data_dir": str(Path(source).resolve())})
        config = config.model_copy(update={"data": pinned})
    return config


def compose(values: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """The run of the files' ``values`` with the flags' ``overrides``, checked. A refusal the
    flags cause (the files' values alone compose) is an OptionError, a usage error: exit 2."""
    try:
        return _checked(build_config(values, overrides))
    except ConfigError as exc:
        if isinstance(exc, OptionError) or not any(v is not None for v in overrides.values()):
            raise
        try:
            _checked(build_config(values, {}))
        except ConfigError:
            raise exc from None  # the files are wrong already: an error in them, exit 1
        raise OptionError(str(exc)) from None


def _checked(config: RunConfig) -> RunConfig:
    """``config``, once its model is known to take its data set's samples."""
    dataset = config.data.dataset
    # A user's data is loaded by the coordinator; a sparse one's spec is known without loading.
    if is_sparse_source(dataset) or not is_user_source(dataset):
        spec = describe(config.data.dataset, hash_features=config.data.hash_features)
        layout = builtin_layout(config.model, spec.sample_shape, spec.num_classes,
                                sparse=spec.sparse)
        if layout is not None:
            config = _enough_ranges(config, ranges_needed(layout))
            partition(layout, config.cluster.ranges)  # the shards (one kind each) fit them
    return config


def _enough_ranges(config: RunConfig, needed: int) -> RunConfig:
    """A layout of sparse and dense keys (the embedding model's table and layers) needs a key
    range of each kind: where the run does not say how many ranges, it gets that many, spread
    over its servers as --key-ranges would (one server then serves both kinds)."""
    cluster = config.cluster
    if cluster.key_ranges is not None or needed <= cluster.ranges:
        return config
    values = config.to_json_dict()
    values["cluster"]["key_ranges"] = needed
    try:  # checked again by every policy: a backend may not serve two ranges on one server
        return parse_config(values)
    except ConfigError as exc:
        raise ConfigError(f"the model needs {needed} key ranges (its sparse and dense keys are "
                          f"never one range) and {cluster.servers} server(s) hold "
                          f"{cluster.ranges}: give --servers {needed} ({exc})") from None


def repeats(config: RunConfig, count: int) -> tuple[str, list[RunConfig]]:
    """The group's name and the configs of ``count`` runs with seeds s, s+1, ..., s+count-1,
    each named after the group and its seed; validated like any config."""
    from engine.recorder.admin import TAG_VALUE_MAX

    group = config.name or default_run_name(config)
    if len(group) > TAG_VALUE_MAX:  # the runs are tagged group=NAME
        raise ConfigError(f"--repeat {count}: the run name has {len(group)} characters; a "
                          f"repeated run's name is its group tag, of at most {TAG_VALUE_MAX}")
    first = config.train.seed
    runs = []
    for seed in range(first, first + count):
        values = config.to_json_dict()
        values["name"] = f"{group}-seed{seed}"
        values["train"]["seed"] = seed
        try:
            runs.append(RunConfig.model_validate(values))
        except ValidationError as exc:
            raise ConfigError(f"--repeat {count} from seed {first}: seed {seed} is out of range "
                              f"({exc.errors()[0]['msg']}); start from a smaller --seed") from None
    return group, runs


def command_started_at() -> float:
    """When this command started (wall clock)."""
    from engine.proctime import program_started_at
    from psctl import IMPORTED_AT

    return program_started_at(IMPORTED_AT)


def run_launch(config: RunConfig, db: Path, console: Console, *, live: bool,
               tags: dict[str, str] | None = None,
               launcher: RunHandle | None = None,
               requested_at: float | None = None) -> LaunchResult:
    """Start a run (or the ``launcher`` given: a resumed one) and wait for its end;
    ``requested_at``: when the user asked for it (its start-up is measured from then)."""
    launcher = launcher or BACKENDS.get(config.cluster.backend)(config, db=db,
                                                                requested_at=requested_at)
    # A run name or path is the user's text, never markup: "[/x]" must print as itself.
    console.print(f"[bold]psctl[/] run [cyan]{launcher.run_id}[/] ({escape(launcher.name)}) → "
                  f"{escape(str(db))}", highlight=False)
    crowded = (oversubscription(config.cluster.workers, config.cluster.servers, usable_cores())
               if BACKENDS.can(config.cluster.backend, THIS_MACHINE) else None)
    if crowded is not None:
        console.print(f"[yellow]warning:[/] {crowded}", highlight=False)
    for risky in (downpour_momentum_note(config), momentum_twice_note(config)):
        if risky is not None:
            console.print(f"[yellow]warning:[/] {risky}", highlight=False)
    launcher.start()
    discard_early()  # started by psctl launch for a run that did not take it (sim, ray...)
    if tags:
        _tag(db, launcher.run_id, tags, console)
    if not live:
        return launcher.wait()
    engine = open_engine(launcher.db, readonly=True)
    plan = Plan(workers=config.cluster.workers, servers=config.cluster.servers,
                epochs=config.train.epochs, max_seconds=config.stop.max_seconds,
                target_accuracy=config.stop.target_accuracy,
                budget=budget_of(config.stop.budget), batch_size=config.train.batch_size)
    try:
        with Live(starting_view(), console=console, refresh_per_second=4,
                  transient=False) as view:
            def tick() -> None:
                try:
                    snapshot = progress(engine, launcher.run_id)
                except PsctlError:
                    return  # the run row may not be committed yet
                view.update(progress_view(snapshot, plan))

            result = launcher.wait(on_tick=tick)
        console.line()  # off a terminal, the last live frame ends without a newline
        return result
    finally:
        engine.dispose()


def _tag(db: Path, run_id: str, tags: dict[str, str], console: Console) -> None:
    # Tagged once the coordinator has recorded the run (it has when start() returns), so that
    # the dashboard and psctl compare see the group while it runs.
    from engine.recorder import set_tags

    try:
        set_tags(db, run_id, tags)
    except PsctlError as exc:
        console.print(f"[yellow]warning:[/] could not tag run {run_id[:8]} "
                      f"({escape(str(exc))}); tag it with psctl runs tag", highlight=False)


def print_group(db: Path, group: str, console: Console) -> None:
    """The group's mean ± standard deviation, as psctl compare shows it."""
    from engine.analysis.cells import cell
    from engine.analysis.compare import comparison_for
    from engine.analysis.table import DEFAULT_TARGET
    from psctl import settings

    engine = open_engine(db, readonly=True)
    try:
        table = comparison_for(engine, [], [f"tag.group={group}"], target=DEFAULT_TARGET,
                               crash_after_s=settings.crash_after_s())
    finally:
        engine.dispose()
    columns = {c.key: c for c in table.columns}
    row = table.rows[0]
    reached = cell(columns["time_to_target_s"], row)
    console.print(f"group {escape(group)}: {row['runs']} runs; best test accuracy "
                  f"{cell(columns['best_accuracy'], row)}; time to {fmt_target(DEFAULT_TARGET)} "
                  f"{reached + ' s' if reached else 'not reached by every run'} "
                  "(mean ± standard deviation)", highlight=False)
    console.print(f"  compare: psctl compare --where group={escape(group)}", highlight=False)


# The lines of a crashed role's traceback the summary shows (the run's process_error event and
# the role's log have all of it).
TRACEBACK_LINES = 4


def print_summary(result: LaunchResult, db: Path, console: Console) -> None:
    from engine.db.faults import crash_traceback
    from engine.db.queries import run_detail

    engine = open_engine(db, readonly=True)
    try:
        detail = run_detail(engine, result.run_id)
        with engine.connect() as conn:
            crash = crash_traceback(conn, result.run_id)
    finally:
        engine.dispose()
    run = detail.summary
    # The launcher knows the run ended even where its end could not be recorded (a full disk):
    # the row then still says running.
    status = result.status.value if run.status in ("running", "crashed") else run.status
    if result.status.value == "failed" and status != "failed":
        # A resume that failed before the run trained again: the run keeps its earlier end.
        console.print(status_text("failed"), f"resume of run {run.id} ({escape(run.name)}); "
                      f"the run stays {status}", highlight=False)
        console.print(f"  reason: {escape(result.reason or '')}", highlight=False)
        console.print(f"  details: psctl runs show {run.id[:8]}", highlight=False)
        return
    console.print(status_text(status), f"run {run.id} ({escape(run.name)})", highlight=False)
    # The run's own duration (ended_at - started_at), as runs ls, runs show and the dashboard
    # show it, not the time this command took.
    # A simulated run's clock is virtual, and the summary says so.
    virtual = " of virtual time (simulated)" if detail.simulated else ""
    console.print(f"  duration {fmt_seconds(run.duration_s)}{virtual}, {run.iterations} "
                  f"iterations, best test accuracy {fmt_pct(run.best_accuracy)}, final "
                  f"{fmt_pct(run.final_accuracy)}", highlight=False)
    if status == "interrupted":
        # Ctrl-C, SIGTERM or SIGHUP: said with how to go on, where it can.
        console.print(f"  interrupted: the run's {result.processes} processes were stopped; "
                      f"logs in {escape(str(result.logs))}", highlight=False)
        console.print(f"  {resume_hint(detail)}", highlight=False)
    elif result.reason:
        console.print(f"  reason: {escape(result.reason)}", highlight=False)
        if crash is not None and crash[0] in result.reason:  # the crash ended the run: where
            for line in crash[1].rstrip().splitlines()[-TRACEBACK_LINES:]:
                console.print(f"    {line}", highlight=False, markup=False)
    if result.failed_children:
        console.print(f"  processes that failed: {', '.join(result.failed_children)}; logs in "
                      f"{escape(str(result.logs))}", style="red", highlight=False)
    console.print(f"  details: psctl runs show {run.id[:8]}", highlight=False)


def resume_hint(detail: RunDetail) -> str:
    """How to go on with an interrupted run: ``psctl resume`` continues it from its newest
    checkpoint (the ``checkpoint`` events it reads), and a run that saved none cannot be."""
    if detail.event_counts.get("checkpoint", 0):
        return (f"continue it from its last checkpoint: psctl resume "
                f"{detail.summary.id[:8]}")
    return ("it saved no checkpoint, so psctl resume cannot continue it; launch with "
            "--checkpoint-every SECONDS to be able to")
