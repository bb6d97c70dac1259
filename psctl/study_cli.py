"""``psctl study FILE.toml``: run a grid of configurations, then write a
report (docs/studies.md)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from psctl import settings
from psctl.cliutil import DbOption, Handled, err, fail

if TYPE_CHECKING:
    from psctl.study import Point, Study
    from psctl.study_outcomes import Outcome, Planned


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
        "--jobs", "-j", min=1, max=256, help="runs in virtual time with every cost given "
        "(cluster.backend sim, sim.compute_ms and sim.server_ms set) at once; other runs go "
        "one at a time [the usable cores]", show_default=False)] = None,
    db: DbOption = None,
) -> None:
    """Run a study: every point of a grid of configurations (runs in virtual time several at
    once, the others one after another), each run tagged
    study=NAME, study_id=ID and AXIS=LABEL; then a report with tables and plots."""
    from psctl.study import grid, load_study, point_configs

    try:
        study = load_study(file)
        if smoke and study.spec.smoke is None:
            err.print(f"warning: {file} has no [smoke] table; --smoke runs the whole grid",
                      highlight=False, markup=False, soft_wrap=True)
        points = grid(study, smoke=smoke)
        if dry_run:
            for point in points:
                point_configs(study, point)  # a dry run checks every point as a real one would
            _print_grid(study, points)
            return
        if report is not None and resume is not None:
            from engine.analysis.selection import UsageError

            raise UsageError("choose one of --report and --resume")
        if report is not None:
            code = _rereport(study, points, file, report, smoke=smoke, out=out,
                             db=settings.database_path(db))
        elif resume is not None:
            code = _run(study, points, file, smoke=smoke, out=out,
                        db=settings.database_path(db), data_dir=data_dir, resume=resume,
                        jobs=jobs)
        else:
            code = _run(study, points, file, smoke=smoke, out=out,
                        db=settings.database_path(db), data_dir=data_dir, jobs=jobs)
    except Handled as exc:
        raise fail(exc) from None
    raise typer.Exit(code)


def _run(study: Study, points: list[Point], file: Path, *, smoke: bool, out: Path | None,
         db: Path, data_dir: Path | None = None, resume: str | None = None,
         jobs: int | None = None) -> int:
    from engine.roles.sampling import usable_cores
    from psctl.study_outcomes import Progress
    from psctl.study_report import Header, Wall, collect, write_report
    from psctl.study_run import new_study_id, plan, prepare_database, run_grid

    started = time.monotonic()
    jobs = jobs or usable_cores()
    planned = plan(study, points, data_dir)
    prepare_database(db)
    study_id = resume or new_study_id()
    kept = [] if resume is None else _finished(db, resume, planned)
    folder = out or file.parent / "results" / (study.name + ("-smoke" if smoke else ""))
    err.print(f"study {study.name} ({study_id}): {len(planned)} runs → {db}"
              + ("" if resume is None else f"; {len(kept)} finished before, kept"),
              highlight=False, markup=False)
    done = {id(o.planned) for o in kept}
    ran = run_grid(study, [p for p in planned if id(p) not in done], db, err,
                   study_id=study_id, smoke=smoke, jobs=jobs)
    order = {id(p): i for i, p in enumerate(planned)}
    progress = Progress(total=len(planned), interrupted=ran.interrupted,
                        outcomes=sorted([*kept, *ran.outcomes], key=lambda o: order[id(o.planned)]))
    command = " ".join(["psctl", "study", shlex.quote(str(file)), *(["--smoke"] if smoke else [])])
    rows = collect(db, progress, study.spec.study.target)
    wall = Wall(seconds=time.monotonic() - started, jobs=jobs, ran=len(ran.outcomes),
                kept=len(kept))
    report = write_report(folder, study, progress, rows,
                          Header(command=command, study_id=study_id, smoke=smoke, wall=wall))
    err.print(f"report: {report}", highlight=False, markup=False)
    if progress.complete:
        return settings.EXIT_OK
    return settings.EXIT_INTERRUPTED if progress.interrupted else settings.EXIT_ERROR


def _recorded(db: Path, study_id: str, planned: list[Planned]) -> list[Outcome]:
    """The planned runs recorded in invocation ``study_id`` (found by their names), in the
    grid's order; a UsageError if it recorded none."""
    from engine.analysis.selection import UsageError
    from engine.db import open_engine
    from engine.db.queries import tagged_runs
    from psctl.study_outcomes import Outcome

    engine = open_engine(db, readonly=True)
    try:
        recorded = tagged_runs(engine, "study_id", study_id)
    finally:
        engine.dispose()
    if not recorded:
        raise UsageError(f"no run in {db} is tagged study_id={study_id}; the id is printed "
                         "when a study starts and is in its report")
    found = [(one, recorded.get(one.config.name or "")) for one in planned]
    return [Outcome(one, *hit) for one, hit in found if hit is not None]


def _finished(db: Path, study_id: str, planned: list[Planned]) -> list[Outcome]:
    """The planned runs that finished in invocation ``study_id``."""
    return [o for o in _recorded(db, study_id, planned) if o.status == "finished"]


def _rereport(study: Study, points: list[Point], file: Path, study_id: str, *, smoke: bool,
              out: Path | None, db: Path) -> int:
    """The report of runs already recorded: each point's run found by its name among the runs
    tagged study_id=STUDY_ID, in the grid's order."""
    from psctl.study_outcomes import Progress
    from psctl.study_report import Header, collect, write_report
    from psctl.study_run import plan

    progress = Progress(total=len(points),
                        outcomes=_recorded(db, study_id, plan(study, points)))
    progress.interrupted = len(progress.outcomes) < progress.total
    folder = out or file.parent / "results" / (study.name + ("-smoke" if smoke else ""))
    command = " ".join(["psctl", "study", shlex.quote(str(file)), *(["--smoke"] if smoke else [])])
    path = write_report(folder, study, progress, collect(db, progress, study.spec.study.target),
                        Header(command=command, study_id=study_id, smoke=smoke))
    err.print(f"report: {path} ({len(progress.outcomes)} of {progress.total} runs)",
              highlight=False, markup=False)
    return settings.EXIT_OK if progress.complete else settings.EXIT_ERROR


def _print_grid(study: Study, points: list[Point]) -> None:
    """One line per point on stdout: its run name, labels and the settings it changes."""
    from engine.analysis.selection import text

    repeat = study.spec.study.repeat
    typer.echo(f"{study.name}: {len(points)} points"
               + (f" x {repeat} seeds" if repeat > 1 else ""))
    for index, point in enumerate(points, 1):
        changes = " ".join(f"{k}={text(v)}" for k, v in point.overrides.items())
        typer.echo(f"{index:>3}  {point.name}  [{point.label}]  {changes}")
