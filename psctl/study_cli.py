"""``psctl study FILE.toml``: run a grid of configurations, then write a
report (docs/studies.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from psctl import settings
from psctl.cliutil import DbOption, Handled, err, fail
from psctl.study_variant import Variant

if TYPE_CHECKING:
    from psctl.study import Point, Study


def register(app: typer.Typer) -> None:
    app.command("study")(study_command)


def study_command(
    file: Annotated[Path, typer.Argument(help="the study's TOML file", show_default=False)],
    smoke: Annotated[bool, typer.Option(
        "--smoke", help="the reduced grid and settings of the file's [smoke] table (for CI)")] =
        False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", "--list", help="check every point's configuration and print the grid; "
        "run nothing")] = False,
    out: Annotated[Path | None, typer.Option(
        help="folder for report.md, its plots and summary.json "
        "[FILE's folder/results/NAME, or NAME-smoke with --smoke]", show_default=False)] = None,
    report: Annotated[str | None, typer.Option(
        "--report", metavar="STUDY_ID", help="run nothing: write the report again from the "
        "runs of an earlier invocation (tagged study_id=STUDY_ID) in the database")] = None,
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="STUDY_ID", help="continue an interrupted invocation: its points "
        "whose run finished are kept, the others run, tagged with the same study id")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="folder with the data sets' files, over the file's data.data_dir "
        "[env: PSCTL_DATA_DIR]", show_default=False)] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, max=256, help="runs in virtual time (cluster.backend sim) at "
        "once, after their costs are measured; other runs go one at a time [the usable cores]",
        show_default=False)] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", help="run every point on this backend: local or ray run the study's "
        "points as real processes in the regime it gives (--compute-ms, --network: batches "
        "padded, connections shaped), leaving out its sim.* settings; the report goes to "
        "results/NAME-BACKEND [the file's cluster.backend]", show_default=False)] = None,
    only: Annotated[list[str] | None, typer.Option(
        "--only", metavar="AXIS=LABEL", help="run only the points with this axis value "
        "(repeatable; several values of one axis are kept together)", show_default=False)] =
        None,
    tuned_from: Annotated[Path | None, typer.Option(
        "--tuned-from", metavar="FOLDER", help="skip [tune]: each point at the best setting "
        "of an earlier report's tuning (FOLDER/summary.json), e.g. to check a simulated "
        "study's points on real processes at the rates it chose", show_default=False)] = None,
    db: DbOption = None,
) -> None:
    """Run a study: every point of a grid of configurations (runs in virtual time several at
    once, the others one after another), each run tagged
    study=NAME, study_id=ID and AXIS=LABEL; then a report with tables and plots."""
    from psctl.study import grid, load_study, point_configs

    try:
        study = load_study(file)
        if backend is not None:
            study = study.on_backend(backend)
        if only:
            study = study.only(_chosen(only))
        if smoke:
            study = study.smoked()
        if smoke and study.spec.smoke is None:
            err.print(f"warning: {file} has no [smoke] table; --smoke runs the whole grid",
                      highlight=False, markup=False, soft_wrap=True)
        points = grid(study, smoke=smoke)
        if tuned_from is not None:  # each point at its earlier best: no [tune] to run
            from psctl.study_tune import tuned_from as pinned_to

            points = pinned_to(study, points, tuned_from)
            study = study.untuned()
        if dry_run:
            for point in points:
                point_configs(study, point)  # a dry run checks every point as a real one would
            if study.spec.tune is not None:
                from psctl.study_tune import check_first

                check_first(study, points, smoke=smoke)
            _print_grid(study, points)
            return
        if report is not None and resume is not None:
            from engine.analysis.selection import UsageError

            raise UsageError("choose one of --report and --resume")
        how = Variant(backend, tuple(only or ()), tuned_from)
        if report is not None:
            code = _rereport(study, points, file, report, smoke=smoke, out=out,
                             db=settings.database_path(db), how=how)
        elif resume is not None:
            code = _run(study, points, file, smoke=smoke, out=out,
                        db=settings.database_path(db), data_dir=data_dir, resume=resume,
                        jobs=jobs, how=how)
        else:
            code = _run(study, points, file, smoke=smoke, out=out,
                        db=settings.database_path(db), data_dir=data_dir, jobs=jobs, how=how)
    except Handled as exc:
        raise fail(exc) from None
    raise typer.Exit(code)


def _chosen(only: list[str]) -> dict[str, list[str]]:
    """``--only AXIS=LABEL`` options, by axis."""
    from engine.analysis.selection import UsageError

    chosen: dict[str, list[str]] = {}
    for item in only:
        axis, sep, label = item.partition("=")
        if not sep or not axis.strip() or not label.strip():
            raise UsageError(f"--only {item!r}: write AXIS=LABEL, e.g. --only sync=BSP")
        chosen.setdefault(axis.strip(), []).append(label.strip())
    return chosen


def _run(study: Study, points: list[Point], file: Path, *, smoke: bool, out: Path | None,
         db: Path, data_dir: Path | None = None, resume: str | None = None,
         jobs: int | None = None, how: Variant | None = None) -> int:
    from engine.proctime import usable_cores
    from psctl.study_invocation import Invocation
    from psctl.study_run import new_study_id, plan, prepare_database
    from psctl.study_tune import SMOKE_TRIALS, check_first

    how = how or Variant()
    if study.spec.tune is not None:
        check_first(study, points, smoke=smoke)
    plan(study, points, data_dir)  # every main run checked before the first run starts
    prepare_database(db)
    study_id = resume or new_study_id()
    invocation = Invocation(study, file, db, study_id, smoke=smoke, data_dir=data_dir,
                            jobs=jobs or usable_cores(), resume=resume is not None, how=how)
    tune = study.spec.tune
    tuning = 0 if tune is None else len(points) * (
        min(tune.size(), SMOKE_TRIALS) if smoke else tune.size()) * (1 if smoke else tune.seeds)
    main = len(points) * study.spec.study.repeat
    err.print(f"study {study.name} ({study_id}): {main + tuning} runs"
              + (f" ({tuning} tuning, then {main})" if tuning else "") + f" → {db}",
              highlight=False, markup=False)
    progress = invocation.run(points, out)
    if progress.complete:
        return settings.EXIT_OK
    return settings.EXIT_INTERRUPTED if progress.interrupted else settings.EXIT_ERROR


def _rereport(study: Study, points: list[Point], file: Path, study_id: str, *, smoke: bool,
              out: Path | None, db: Path, how: Variant | None = None) -> int:
    """The report of runs already recorded: each run found by its name among the runs tagged
    study_id=STUDY_ID (a [tune] search replayed from them), in the grid's order."""
    from psctl.study_invocation import Invocation

    how = how or Variant()
    invocation = Invocation(study, file, db, study_id, smoke=smoke, data_dir=None, jobs=1,
                            resume=True, run_nothing=True, how=how)
    progress = invocation.run(points, out)
    return settings.EXIT_OK if progress.complete else settings.EXIT_ERROR


def _print_grid(study: Study, points: list[Point]) -> None:
    """One line per point on stdout: its run name, labels and the settings it changes."""
    from engine.analysis.selection import text

    repeat = study.spec.study.repeat
    typer.echo(f"{study.name}: {len(points)} points"
               + (f" x {repeat} seeds" if repeat > 1 else ""))
    tune = study.spec.tune
    if tune is not None:
        typer.echo(f"tune ({tune.method}): {tune.size()} settings x {tune.seeds} seeds per point "
                   f"({tune.size() * tune.seeds * len(points)} runs), then each point at its "
                   f"best: {', '.join(p.key for p in tune.param)}")
    for index, point in enumerate(points, 1):
        changes = " ".join(f"{k}={text(v)}" for k, v in point.overrides.items())
        typer.echo(f"{index:>3}  {point.name}  [{point.label}]  {changes}")
