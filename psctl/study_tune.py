"""A study's ``[tune]`` (issue 41, part 3): each grid point is compared at its own best setting.

Per grid point, settings are tried on ``tune.seeds`` seeds of their own (after the main runs'
seeds, so that no main run's seed chose its setting) under ``tune.set`` (a shorter budget,
say); each setting is scored by the objective's mean over those seeds, and the best one is
added to the point's overrides for its main runs. ``method = "grid"`` tries every combination
of the params' values; ``method = "optuna"`` asks Optuna's TPE sampler (seeded per point, so a
study is repeatable and ``--resume`` replays it) for ``trials`` settings, a round at a time so
that rounds fill ``--jobs``.

Scores: ``time_to_target`` is the mean over seeds of seconds to the target, a seed that did
not reach it counting twice its run's duration (lower is better); the accuracies are means, a
run without an evaluation counting 0. A setting *reached* the target when every one of its
seeds did; the share of settings that did is the point's robustness (DistBelief's claim for
Adagrad is that it makes more of a grid converge).
"""

from __future__ import annotations

import itertools
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from engine.analysis.selection import flatten
from engine.errors import ConfigError
from engine.plan import build_config
from psctl.study import Point, Study, Tune, TuneParam
from psctl.study_outcomes import Planned, Progress
from psctl.study_rows import Row

SMOKE_TRIALS = 2  # settings per point under --smoke, on one seed
PENALTY = 2.0  # a seed that missed the target counts PENALTY x its run's duration


@dataclass(frozen=True)
class Trial:
    point: Point
    index: int
    params: dict[str, Any]


@dataclass
class Tried:
    trial: Trial
    rows: list[Row]
    score: float | None  # None: no run of the setting was recorded
    reached: bool


@dataclass
class Tuned:
    """One grid point's tuning: every setting tried, and the one its main runs use."""

    point: Point
    objective: str
    tried: list[Tried] = field(default_factory=list)

    @property
    def best(self) -> Tried | None:
        scored = [t for t in self.tried if t.score is not None]
        if not scored:
            return None
        lower = self.objective == "time_to_target"
        # Ties (evaluations fall on a grid of times) go to the higher mean final accuracy.
        return min(scored, key=lambda t: ((t.score or 0.0) * (1 if lower else -1),
                                          -(score(t.rows, "final_accuracy") or 0.0)))

    @property
    def reached_share(self) -> float | None:
        return (sum(t.reached for t in self.tried) / len(self.tried)) if self.tried else None


class Search(Protocol):
    def ask(self, count: int) -> list[dict[str, Any]]: ...
    def tell(self, index: int, score: float | None) -> None: ...
    @property
    def left(self) -> int: ...


class GridSearch:
    """Every combination of the params' values, in file order (the last param fastest)."""

    def __init__(self, spec: Tune, limit: int | None) -> None:
        combos = itertools.product(*(p.values or () for p in spec.param))
        self._todo = [dict(zip((p.key for p in spec.param), c, strict=True)) for c in combos]
        if limit is not None:
            self._todo = self._todo[:limit]

    def ask(self, count: int) -> list[dict[str, Any]]:
        asked, self._todo = self._todo[:count], self._todo[count:]
        return asked

    def tell(self, index: int, score: float | None) -> None:
        pass  # a grid does not learn

    @property
    def left(self) -> int:
        return len(self._todo)


class OptunaSearch:
    """Optuna's TPE sampler, seeded: the same results told in the same order give the same
    settings, which is what lets --resume and --report replay a search."""

    def __init__(self, spec: Tune, seed: int, trials: int) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        startup = min(10, max(2, trials // 3))  # random settings before TPE models the rest
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
        self._study = optuna.create_study(sampler=sampler, direction=(
            "minimize" if spec.objective == "time_to_target" else "maximize"))
        self._spec, self._left, self._open = spec, trials, {}  # type: ignore[var-annotated]
        self._asked = 0

    def ask(self, count: int) -> list[dict[str, Any]]:
        asked = []
        for _ in range(min(count, self._left)):
            trial = self._study.ask()
            asked.append({p.key: _suggest(trial, p) for p in self._spec.param})
            self._open[self._asked] = trial
            self._asked += 1
            self._left -= 1
        return asked

    def tell(self, index: int, score: float | None) -> None:
        from optuna.trial import TrialState

        trial = self._open.pop(index)
        if score is None or not math.isfinite(score):
            self._study.tell(trial, state=TrialState.FAIL)
        else:
            self._study.tell(trial, score)

    @property
    def left(self) -> int:
        return self._left


def _suggest(trial: Any, param: TuneParam) -> Any:
    if param.values is not None:
        return trial.suggest_categorical(param.key, param.values)
    assert param.low is not None and param.high is not None  # TuneParam's validator
    return trial.suggest_float(param.key, param.low, param.high, log=param.log)


def search_for(study: Study, point: Point, *, smoke: bool) -> Search:
    spec = study.spec.tune
    assert spec is not None
    if spec.method == "grid":
        return GridSearch(spec, SMOKE_TRIALS if smoke else None)
    trials = min(spec.trials or 1, SMOKE_TRIALS) if smoke else (spec.trials or 1)
    return OptunaSearch(spec, zlib.crc32(point.name.encode()), trials)


def trial_runs(study: Study, trial: Trial, *, smoke: bool) -> list[Planned]:
    """The runs of one setting: one per tuning seed, validated like any configuration."""
    spec = study.spec.tune
    assert spec is not None
    point = trial.point
    overrides = flatten(spec.set) | point.overrides | trial.params
    name = f"{point.name}-tune{trial.index}"
    try:
        first = build_config(study.spec.base, overrides | {"name": name})
    except ConfigError as exc:
        raise ConfigError(f"{study.path}: grid point {point.label}, [tune] setting "
                          f"{shown(trial.params)}: {exc}") from None
    start = first.train.seed + study.spec.study.repeat  # after the main runs' seeds
    seeds = range(start, start + (1 if smoke else spec.seeds))
    tried = replace(point, name=name)
    try:
        return [Planned(tried, build_config(study.spec.base, overrides | {
            "train.seed": seed, "name": f"{name}-seed{seed}"}), seed, trial.index)
            for seed in seeds]
    except ConfigError as exc:
        raise ConfigError(f"{study.path}: grid point {point.label}, [tune] seeds from {start}: "
                          f"{exc}; start from a smaller train.seed") from None


def score(rows: list[Row], objective: str) -> float | None:
    if not rows:
        return None
    if objective == "time_to_target":
        return sum(r.time_to_target_s if r.time_to_target_s is not None
                   else PENALTY * r.duration_s for r in rows) / len(rows)
    values = [getattr(r, objective) for r in rows]
    return sum(v or 0.0 for v in values) / len(values)


# What tune() is handed: runs planned runs (or, for --report, only finds them) and gives back
# their outcomes and their rows.
Runner = Callable[[list[Planned]], tuple[Progress, list[Row]]]


def tune(study: Study, points: list[Point], runner: Runner, *, smoke: bool,
         jobs: int) -> tuple[list[Tuned], bool]:
    """Every point's search, round by round; returns the tunings and whether it was
    interrupted (then the main runs must not start)."""
    spec = study.spec.tune
    assert spec is not None
    searches = [search_for(study, p, smoke=smoke) for p in points]
    tunings = [Tuned(p, spec.objective) for p in points]
    seeds = 1 if smoke else spec.seeds
    per_round = max(1, math.ceil(jobs / (len(points) * seeds)))
    while any(s.left for s in searches):
        batch = [Trial(p, len(t.tried) + k, params)
                 for p, s, t in zip(points, searches, tunings, strict=True)
                 for k, params in enumerate(s.ask(per_round if isinstance(s, OptunaSearch)
                                                  else s.left))]
        planned = {id(trial): trial_runs(study, trial, smoke=smoke) for trial in batch}
        progress, rows = runner([run for runs in planned.values() for run in runs])
        for trial in batch:
            names = {run.config.name for run in planned[id(trial)]}
            mine = [r for r in rows if r.name in names]
            tuned = tunings[points.index(trial.point)]
            found = score(mine, spec.objective)
            reached = len(mine) == len(names) and all(
                r.time_to_target_s is not None and r.status == "finished" for r in mine)
            tuned.tried.append(Tried(trial, mine, found, reached))
            searches[points.index(trial.point)].tell(trial.index, found)
        if progress.interrupted:
            return tunings, True
    return tunings, False


def tuned_points(tunings: list[Tuned]) -> list[Point]:
    """Each point with its best setting over its overrides (as it was when none scored)."""
    out = []
    for tuned in tunings:
        best = tuned.best
        params = best.trial.params if best is not None else {}
        out.append(replace(tuned.point, overrides=tuned.point.overrides | params))
    return out


def tuned_from(study: Study, points: list[Point], folder: Path) -> list[Point]:
    """Each point with the best setting an earlier report's tuning found for it (its labels
    matched in ``folder``/summary.json); a ConfigError when the report has none for it."""
    path = folder / "summary.json"
    try:
        tuning = json.loads(path.read_text()).get("tuning") or {}
        best = {tuple(sorted(p["labels"].items())): p["best"] for p in tuning.get("points", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"--tuned-from {folder}: cannot read its tuning ({exc})") from None
    out = []
    for point in points:
        found = best.get(tuple(sorted(point.labels)))
        if found is None:
            raise ConfigError(f"--tuned-from {folder}: {path} holds no tuning of point "
                              f"{point.label} (tuned: {len(best)} points)")
        out.append(replace(point, overrides=point.overrides | found))
    return out


def check_first(study: Study, points: list[Point], *, smoke: bool) -> None:
    """Before anything runs: each point's tuning runs build with the params' first values (a
    range at either end), so a mistake in [tune] fails at once."""
    spec = study.spec.tune
    assert spec is not None
    for point in points:
        for end in ("low", "high"):
            params = {p.key: p.values[0] if p.values is not None else getattr(p, end)
                      for p in spec.param}
            trial_runs(study, Trial(point, 0, params), smoke=smoke)


def shown(params: dict[str, Any]) -> str:
    """A setting as the report prints it: ``optimizer.lr=0.03, optimizer.momentum=0.9``."""
    return ", ".join(f"{k}={f'{v:.3g}' if isinstance(v, float) else v}"
                     for k, v in params.items())
