"""Running a study's grid: every configuration checked first, then one run after another, each
tagged with the study, this invocation and its label on every axis."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from engine.config import RunConfig
from engine.errors import StoreError
from psctl.study import Point, Study, point_configs
from psctl.study_outcomes import Outcome, Planned, Progress


def new_study_id() -> str:
    return secrets.token_hex(4)


def plan(study: Study, points: list[Point], data_dir: Path | None = None) -> list[Planned]:
    """Every run of the grid, each configuration validated and its data set located before
    any run starts: a mistake in the last point must not surface hours into the study.
    ``data_dir`` (``--data-dir``) is where data sets are looked for first, before the file's
    own ``data.data_dir``."""
    repeat = study.spec.study.repeat
    located: dict[tuple[str, str | None], str] = {}
    planned = []
    for point in points:
        for config in point_configs(study, point):
            seed = config.train.seed if repeat > 1 else None
            planned.append(Planned(point, _pinned(config, located, data_dir), seed))
    return planned


def pinned(planned: list[Planned], data_dir: Path | None = None) -> list[Planned]:
    """``planned`` with each data set located and pinned (as plan() does)."""
    located: dict[tuple[str, str | None], str] = {}
    return [replace(one, config=_pinned(one.config, located, data_dir)) for one in planned]


def tags_for(study: Study, planned: Planned, study_id: str, *, smoke: bool) -> dict[str, str]:
    tags = {"study": study.name, "study_id": study_id, **dict(planned.point.labels)}
    if planned.seed is not None:
        # group: psctl compare folds a point's seeds into one row of mean ± deviation.
        tags |= {"group": f"{planned.point.name}-{study_id}", "seed": str(planned.seed)}
    if planned.tune is not None:
        tags["tune"] = str(planned.tune)
    if smoke:
        tags["smoke"] = "true"
    return tags


def _calibrate(configs: list[RunConfig], console: Console, name: str) -> None:
    """Measure, one after another, the costs the simulations will read (each is timed on this
    machine once and cached): several measured at once would time a busy machine."""
    from engine.sim.building import calibrate

    console.print(f"study {name}: measuring this machine's costs (once; cached)",
                  highlight=False, markup=False)
    seen: set[str] = set()
    for config in configs:
        key = config.model_dump_json(include={"data", "model", "optimizer", "train", "cluster"})
        if key not in seen:
            seen.add(key)
            calibrate(config)


def run_grid(study: Study, planned: list[Planned], db: Path, console: Console, *,
             study_id: str, smoke: bool, jobs: int = 1) -> Progress:
    """Every run: the load-free ones (engine.backends.load_free) ``jobs`` at a time, then the
    others one after another. Ctrl-C (the backend stops each run it interrupts) ends the
    study."""
    from engine.backends import load_free
    from psctl.launch import run_launch
    from psctl.study_pool import run_parallel

    done = Progress(total=len(planned), outcomes=[])
    target = study.spec.study.target
    together = [(i, one) for i, one in enumerate(planned) if jobs > 1 and load_free(one.config)]
    alone = [(i, one) for i, one in enumerate(planned) if (i, one) not in together]

    def announce(index: int, outcome: Outcome) -> None:
        console.print(f"study {study.name}: {index + 1} of {len(planned)}: "
                      f"{_named(outcome.planned)}: {result_line(db, outcome.run_id, target)}",
                      highlight=False, markup=False, soft_wrap=True)

    if together:
        _calibrate([one.config for _, one in together], console, study.name)
        console.print(f"study {study.name}: {len(together)} runs in virtual time, {jobs} at "
                      "a time", highlight=False, markup=False)
        run_parallel([(i, one, tags_for(study, one, study_id, smoke=smoke))
                      for i, one in together], db, jobs, console, done, announce)
    try:
        for index, one in alone:
            if done.interrupted:
                break
            console.print(f"study {study.name}: point {index + 1} of {len(planned)}: "
                          f"{_named(one)}", highlight=False, markup=False, soft_wrap=True)
            result = run_launch(one.config, db, console, live=False,
                                tags=tags_for(study, one, study_id, smoke=smoke))
            done.outcomes.append(Outcome(one, result.run_id, result.status.value))
            console.print(f"  {result_line(db, result.run_id, target)}",
                          highlight=False, markup=False, soft_wrap=True)
            if result.status.value == "interrupted":
                done.interrupted = True
    except KeyboardInterrupt:  # between two runs, or while one was being set up
        done.interrupted = True
    if done.interrupted:
        console.print(f"study {study.name} interrupted after {len(done.outcomes)} of "
                      f"{len(planned)} runs; no run is left running", highlight=False,
                      markup=False)
    return done


def _named(one: Planned) -> str:
    tune = f", tuning setting {one.tune}" if one.tune is not None else ""
    return one.point.label + tune + (f", seed {one.seed}" if one.seed is not None else "")


def result_line(db: Path, run_id: str, target: float) -> str:
    from engine.analysis.cells import fmt_seconds
    from engine.db import open_engine
    from engine.db.metrics import run_metrics
    from engine.db.queries import run_summaries
    from psctl.display import fmt_pct

    engine = open_engine(db, readonly=True)
    try:
        (run,) = run_summaries(engine, [run_id])
        reached = run_metrics(engine, run_id, target=target).time_to_target_s
    finally:
        engine.dispose()
    to_target = "not reached" if reached is None else f"reached in {reached:.1f} s"
    return (f"{run.status} {run.id[:8]} in {fmt_seconds(run.duration_s)}: {run.iterations} "
            f"iterations, best {fmt_pct(run.best_accuracy)}, final "
            f"{fmt_pct(run.final_accuracy)}; {target:.0%} {to_target}")


def prepare_database(path: Path) -> None:
    """Create (or upgrade) the database now, so an unusable path fails before any run."""
    from engine.db import open_engine

    if path.is_dir():
        raise StoreError(f"the experiments database {path} is a folder; give a file path")
    try:
        open_engine(path).dispose()
    except OSError as exc:
        raise StoreError(f"cannot create the experiments database {path}: "
                         f"{exc.strerror or exc}") from None


def _pinned(config: RunConfig, located: dict[tuple[str, str | None], str],
            data_dir: Path | None = None) -> RunConfig:
    # As psctl launch does: the data set is found (or fetched) once, here, and its folder
    # pinned in the config, so every run's processes read the same files.
    from engine.datasets import locate
    from engine.datasets.sources import is_user_source

    if data_dir is None and config.data.data_dir:
        data_dir = Path(config.data.data_dir)
    key = (config.data.dataset, None if data_dir is None else str(data_dir))
    if key not in located:
        located[key] = locate(config.data.dataset, data_dir, allow_download=True)
    source = located[key]
    if source in ("sklearn", "generated") or is_user_source(config.data.dataset):
        return config
    pinned = config.data.model_copy(update={"data_dir": str(Path(source).resolve())})
    return config.model_copy(update={"data": pinned})
