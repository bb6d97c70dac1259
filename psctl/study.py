"""A study file (``psctl study FILE.toml``): a base configuration and the axes of a grid.

The grid is the cross product of the axes, in file order; each point's configuration is
``build_config([base], axis overrides [+ smoke overrides])``. Everything a mistake could break
is checked when the file is read, so a typo fails before the first of many runs starts. See
docs/studies.md for the format.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.analysis.selection import flatten, text
from engine.config import RunConfig, load_toml, merge
from engine.errors import ConfigError
from engine.plan import build_config

SLUG = r"^[a-z0-9]+(-[a-z0-9]+)*$"
# Tags every run of a study carries besides one per axis; an axis may not shadow them.
RESERVED_TAGS = frozenset({"study", "study_id", "group", "seed", "smoke", "tune"})
# Runs one study may have (grid points x repeat): even several at a time, a larger grid
# is a mistake (a 10^6-point grid took 105 s only to be listed); split it into studies.
MAX_RUNS = 1000
STUDY_ID_TAIL = 9  # "-" and the study id's 8 hex digits (psctl.study_run.new_study_id)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class StudyMeta(_Strict):
    name: str = Field(pattern=SLUG, max_length=60,
                      description="lower-case letters, digits and dashes; names the runs")
    title: str = Field(min_length=1, description="the report's heading")
    seed_doc: str | None = Field(None, description="the seed document the study reproduces")
    target: float = Field(gt=0, le=1, description="accuracy that time to target is measured to")
    repeat: int = Field(1, ge=1, le=100, description="seeds per grid point")
    baseline: dict[str, str] | None = Field(None, description=(
        "with repeat: each point's ratios are to the point with these axis labels and its "
        "own on every other axis, e.g. { sync = \"BSP\" } [the grid's first point]"))
    description: str | None = Field(None, description="a paragraph for the report")


class AxisValue(_Strict):
    label: str = Field(min_length=1, max_length=60)
    set: dict[str, Any] = Field(min_length=1, description="dotted config keys and values")


class Axis(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=40)
    key: str | None = Field(None, description="shorthand: values are plain values of this key")
    values: list[Any] = Field(min_length=1)

    def points(self) -> list[AxisValue]:
        """The values as label + overrides, whichever way the file wrote them."""
        if self.key is None:
            return [_value(AxisValue.model_validate(v)) for v in self.values]
        return [AxisValue(label=text(v), set={self.key: v}) for v in self.values]


def _value(value: AxisValue) -> AxisValue:
    # set = { sync.model = "ssp" } (TOML's dotted keys, nested) means set = { "sync.model" = ... }
    return AxisValue(label=value.label, set=flatten(value.set))


class Smoke(_Strict):
    set: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    repeat: int | None = Field(None, ge=1, le=100, description="seeds per point under --smoke")


class TuneParam(_Strict):
    """One tuned setting: ``values`` (a grid's, or Optuna's categorical) or a range
    ``low``..``high`` (Optuna only; ``log`` for a log-uniform draw)."""

    key: str = Field(min_length=1, description="a dotted config key, e.g. optimizer.lr")
    values: list[bool | int | float | str] | None = Field(None, min_length=1, max_length=100)
    low: float | None = None
    high: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> TuneParam:
        ranged = self.low is not None or self.high is not None
        if (self.values is None) == (not ranged):
            raise ValueError("give values = [...] or low and high, not both")
        if ranged and (self.low is None or self.high is None or not self.low < self.high):
            raise ValueError("a range needs low < high")
        if ranged and self.log and self.low is not None and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        if self.log and not ranged:
            raise ValueError("log applies to a range (low, high)")
        return self


class Tune(_Strict):
    """``[tune]``: each grid point tries these settings on ``seeds`` seeds under ``set`` (a
    shorter budget, say) and is then run at its best (psctl/study_tune.py)."""

    method: Literal["grid", "optuna"] = "grid"
    trials: int | None = Field(None, ge=1, le=200, description="optuna: settings tried per point")
    seeds: int = Field(2, ge=1, le=10, description="seeds per tried setting")
    objective: Literal["time_to_target", "final_accuracy", "best_accuracy"] = "time_to_target"
    set: dict[str, Any] = Field(default_factory=dict, description="overrides of tuning runs")
    param: list[TuneParam] = Field(min_length=1, max_length=10)

    @model_validator(mode="after")
    def _method_fits(self) -> Tune:
        if self.method == "optuna" and self.trials is None:
            raise ValueError("method optuna needs trials = N")
        if self.method == "grid" and self.trials is not None:
            raise ValueError("a grid tries every combination; trials is for method optuna")
        if self.method == "grid" and any(p.values is None for p in self.param):
            raise ValueError("a grid needs values = [...] for every param; ranges (low, high) "
                             "are for method optuna")
        keys = [p.key for p in self.param]
        if len(set(keys)) < len(keys):
            raise ValueError("a key is tuned twice")
        return self

    def size(self) -> int:
        """Settings tried per grid point."""
        if self.trials is not None:
            return self.trials
        return math.prod(len(p.values or ()) for p in self.param)


class StudyFile(_Strict):
    study: StudyMeta
    base: dict[str, Any] = Field(default_factory=dict)
    axis: list[Axis] = Field(min_length=1)
    tune: Tune | None = None
    smoke: Smoke | None = None


@dataclass(frozen=True)
class Point:
    """One grid point (one run, or ``repeat`` of them)."""

    labels: tuple[tuple[str, str], ...]  # (axis name, value label), in axis order
    overrides: dict[str, Any]
    name: str  # the run name: <study>-<label>-<label>...

    @property
    def label(self) -> str:
        return ", ".join(f"{axis}={label}" for axis, label in self.labels)


@dataclass(frozen=True)
class Study:
    path: Path
    spec: StudyFile

    @property
    def name(self) -> str:
        return self.spec.study.name

    @property
    def axes(self) -> list[str]:
        return [axis.name for axis in self.spec.axis]

    def on_backend(self, backend: str) -> Study:
        """The study's runs on ``backend`` (``psctl study --backend``). The regime a point
        gives (``regime.compute_ms``, ``regime.network``) applies on every backend: real
        processes are padded and shaped to it. Its ``sim.*`` settings say how the simulator
        charges time, so they are left out of a run on real processes."""
        def kept(values: dict[str, Any]) -> dict[str, Any]:  # nested tables or dotted keys
            return values if backend == "sim" else {
                k: v for k, v in values.items() if k != "sim" and not k.startswith("sim.")}

        spec = self.spec
        axes = []
        for axis in spec.axis:
            values = [AxisValue.model_construct(label=v.label, set=kept(v.set))
                      for v in axis.points()]
            if any(not value.set for value in values):
                raise ConfigError(f"{self.path}: axis {axis.name} varies only sim.* settings, "
                                  f"which a run on the {backend} backend does not take")
            axes.append(axis.model_copy(update={"key": None, "values": values}))
        update: dict[str, Any] = {"base": merge(kept(spec.base), {"cluster.backend": backend}),
                                  "axis": axes}
        if spec.tune is not None:
            update["tune"] = spec.tune.model_copy(update={"set": kept(spec.tune.set)})
        if spec.smoke is not None:
            update["smoke"] = spec.smoke.model_copy(update={"set": kept(spec.smoke.set)})
        return Study(self.path, spec.model_copy(update=update))

    def only(self, chosen: dict[str, list[str]]) -> Study:
        """The study with only the axis values ``chosen`` names (axis -> labels; an axis not
        named keeps all); a ConfigError names what is not in the file."""
        axes = []
        for axis in self.spec.axis:
            wanted = chosen.get(axis.name)
            values = axis.points()
            if wanted is not None:
                labels = [v.label for v in values]
                unknown = [label for label in wanted if label not in labels]
                if unknown:
                    raise ConfigError(f"{self.path}: axis {axis.name} has no value "
                                      f"{', '.join(map(repr, unknown))} (its values: "
                                      f"{', '.join(map(repr, labels))})")
                values = [v for v in values if v.label in wanted]
            axes.append(axis.model_copy(update={"key": None, "values": values}))
        unknown_axes = sorted(set(chosen) - set(self.axes))
        if unknown_axes:
            raise ConfigError(f"{self.path}: no axis {', '.join(unknown_axes)} (its axes: "
                              f"{', '.join(self.axes)})")
        return Study(self.path, self.spec.model_copy(update={"axis": axes}))

    def untuned(self) -> Study:
        """The study without its [tune] table (its points pinned already)."""
        return Study(self.path, self.spec.model_copy(update={"tune": None}))

    def smoked(self) -> Study:
        """The study as --smoke runs it: [smoke] repeat, when given, over [study] repeat."""
        smoke = self.spec.smoke
        if smoke is None or smoke.repeat is None:
            return self
        meta = self.spec.study.model_copy(update={"repeat": smoke.repeat})
        return Study(self.path, self.spec.model_copy(update={"study": meta}))


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-.") or "x"


def load_study(path: Path) -> Study:
    """Read and check ``path``; every error names the file and the key to fix."""
    raw = load_toml(path)
    try:
        spec = StudyFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{where}: {what}" for where, what in _problems(exc, raw))
        raise ConfigError(f"{path}: {problems}") from None
    _check_size(spec, path)
    for axis in spec.axis:
        _check_values(axis, path)
    _check(spec, path)
    return Study(path, spec)


def grid(study: Study, *, smoke: bool = False) -> list[Point]:
    """Every point of the grid, the first axis varying slowest; with ``smoke`` only the values
    [smoke] keeps, and its settings over every point."""
    spec = study.spec
    chosen = [_restricted(axis, spec.smoke) if smoke and spec.smoke else
              axis.points() for axis in spec.axis]
    extra = flatten(spec.smoke.set) if smoke and spec.smoke else {}
    points = []
    for combo in itertools.product(*chosen):
        labels = tuple((axis.name, value.label) for axis, value in zip(spec.axis, combo,
                                                                        strict=True))
        overrides = {k: v for value in combo for k, v in value.set.items()} | extra
        name = "-".join([study.name, *(slug(value.label) for value in combo)])
        points.append(Point(labels, overrides, name))
    return points


def point_configs(study: Study, point: Point) -> list[RunConfig]:
    """The run configurations of ``point``: one per seed, first validated as a whole."""
    base = study.spec.base
    overrides = {**point.overrides, "name": point.name}
    try:
        first = build_config(base, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{study.path}: grid point {point.label}: {exc}") from None
    repeat = study.spec.study.repeat
    if repeat == 1:
        return [first]
    seeds = range(first.train.seed, first.train.seed + repeat)
    try:
        return [build_config(base, overrides | {"train.seed": seed,
                                                "name": f"{point.name}-seed{seed}"})
                for seed in seeds]
    except ConfigError as exc:
        raise ConfigError(f"{study.path}: grid point {point.label}, repeat {repeat}: {exc}; "
                          "start from a smaller train.seed") from None


def _restricted(axis: Axis, smoke: Smoke) -> list[AxisValue]:
    keep = smoke.axes.get(axis.name)
    if keep is None:
        return axis.points()
    wanted = {text(value) for value in keep}  # a shorthand value's label is the value
    return [p for p in axis.points() if p.label in wanted]


def _check_size(spec: StudyFile, path: Path) -> None:
    """The whole grid within MAX_RUNS, counted before any point is made."""
    sizes = [len(axis.values) for axis in spec.axis]
    tuning = spec.tune.size() * spec.tune.seeds if spec.tune else 0
    runs = math.prod(sizes) * (spec.study.repeat + tuning)
    if runs > MAX_RUNS:
        shape = " x ".join(map(str, sizes))
        repeat = f" x {spec.study.repeat} seeds" if spec.study.repeat > 1 else ""
        if spec.tune:
            repeat = (f" x ({spec.study.repeat} seeds + {spec.tune.size()} tuned settings x "
                      f"{spec.tune.seeds} seeds)")
        raise ConfigError(f"{path}: the grid has {runs:,} runs ({shape} values{repeat}); a "
                          f"study runs at most {MAX_RUNS:,}: split it into "
                          "several studies or drop values")


def _check_values(axis: Axis, path: Path) -> None:
    where = f"{path}: [[axis]] {axis.name}"
    for index, value in enumerate(axis.values):
        if axis.key is not None:
            if isinstance(value, dict):
                raise ConfigError(f"{where} values[{index}]: with key = {axis.key!r} the "
                                  "values are plain values; drop key to give tables of "
                                  "label and set")
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where} values[{index}]: {text(value)!r} is a plain value; "
                              "give [[axis.values]] tables with label and set, or key = "
                              "\"section.setting\" for plain values")
        try:
            AxisValue.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(f"values[{index}].{key}: {what}"
                                 for key, what in _problems(exc, {}))
            raise ConfigError(f"{where} {problems}") from None


def _check(spec: StudyFile, path: Path) -> None:
    from psctl.configsources import known_keys

    known = known_keys()

    def require_known(keys: list[str], where: str) -> None:
        for key in keys:
            parts = key.split(".")
            if not any(".".join(parts[:n]) in known for n in range(1, len(parts) + 1)):
                raise ConfigError(f"{path}: {where}: unknown setting {key!r} (the sections of "
                                  "a psctl launch --config file: cluster.workers, sync.model, "
                                  "train.epochs, ...; psctl config show lists them all)")

    base = flatten(spec.base)
    require_known(list(base), "[base]")
    if "name" in base:
        raise ConfigError(f"{path}: [base] name: runs are named after the study and their "
                          "labels; remove it")
    names = [axis.name for axis in spec.axis]
    owners: dict[str, str] = {}
    for axis in spec.axis:
        where = f"[[axis]] {axis.name}"
        if names.count(axis.name) > 1:
            raise ConfigError(f"{path}: {where}: two axes share this name; rename one")
        if axis.name in RESERVED_TAGS:
            raise ConfigError(f"{path}: {where}: the name is a tag every study run has "
                              f"({', '.join(sorted(RESERVED_TAGS))}); choose another")
        points = axis.points()
        slugs = [slug(p.label) for p in points]
        for label, one in zip((p.label for p in points), slugs, strict=True):
            if slugs.count(one) > 1:
                raise ConfigError(f"{path}: {where}: value {label!r} repeats another value's "
                                  f"label (as run names: {one!r}); give each value its own")
        keys = {k for p in points for k in p.set}
        require_known(sorted(keys), where)
        if "name" in keys:
            raise ConfigError(f"{path}: {where}: sets name; runs are named by the study")
        for key in sorted(keys):
            if key in owners:
                raise ConfigError(f"{path}: {where}: sets {key!r}, which axis {owners[key]} "
                                  "sets too; one axis per setting")
            owners[key] = axis.name
    for name, label in (spec.study.baseline or {}).items():
        chosen = next((a for a in spec.axis if a.name == name), None)
        if chosen is None:
            raise ConfigError(f"{path}: [study] baseline.{name}: no axis of that name (axes: "
                              f"{', '.join(names)})")
        offered = [p.label for p in chosen.points()]
        if label not in offered:
            raise ConfigError(f"{path}: [study] baseline.{name}: {label!r} is none of the "
                              f"axis's values ({', '.join(offered)})")
    if spec.tune is not None:
        tuned = [p.key for p in spec.tune.param]
        require_known(tuned, "[tune] param")
        require_known(list(flatten(spec.tune.set)), "[tune] set")
        for key in tuned:
            if key in owners:
                raise ConfigError(f"{path}: [tune] param {key!r}: axis {owners[key]} sets it; "
                                  "a setting is tuned or varied, not both")
    if spec.smoke is not None:
        _check_smoke(spec, path, require_known)
    _check_group_tags(spec, path)


def _check_group_tags(spec: StudyFile, path: Path) -> None:
    """With ``repeat``, each point's runs are tagged group=<run name>-<study id>: within the
    tag values' bound, so that tagging cannot fail between runs."""
    from engine.recorder.admin import TAG_VALUE_MAX

    if spec.study.repeat == 1 and spec.tune is None:
        return
    longest = len(spec.study.name) + sum(
        1 + max(len(slug(value.label)) for value in axis.points()) for axis in spec.axis)
    if spec.tune is not None:  # a tuning run's group: <point>-tune<K>-<study id>
        longest += len(f"-tune{spec.tune.size() - 1}")
    if longest + STUDY_ID_TAIL > TAG_VALUE_MAX:
        raise ConfigError(f"{path}: run names reach {longest} characters; with repeat they "
                          f"are group tags (name-study id) of at most {TAG_VALUE_MAX}: "
                          "shorten the study's name or the values' labels")


def _check_smoke(spec: StudyFile, path: Path,
                 require_known: Callable[[list[str], str], None]) -> None:
    assert spec.smoke is not None
    require_known(list(spec.smoke.set), "[smoke] set")
    axes = {axis.name: axis for axis in spec.axis}
    for name, keep in spec.smoke.axes.items():
        if name not in axes:
            raise ConfigError(f"{path}: [smoke] axes.{name}: no axis of that name (axes: "
                              f"{', '.join(axes)})")
        axis = axes[name]
        offered = [p.label for p in axis.points()]
        if not keep:
            raise ConfigError(f"{path}: [smoke] axes.{name}: keep at least one value")
        for value in keep:
            if text(value) not in offered:
                raise ConfigError(f"{path}: [smoke] axes.{name}: {text(value)!r} is none of "
                                  f"the axis's values ({', '.join(offered)})")


def _problems(exc: ValidationError, raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(where in the file, what is wrong) of each error pydantic found."""
    problems = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key; remove it or check its spelling"
        elif error["type"] == "missing":
            message = "missing; add it"
        else:
            shown = repr(error["input"])
            message += f" (got {shown if len(shown) <= 60 else shown[:60] + '…'})"
        problems.append((_where(error["loc"], raw), message))
    return problems


def _where(loc: tuple[int | str, ...], raw: dict[str, Any]) -> str:
    """A location as a person finds it in the file: ``[[axis]] workers values[2]``."""
    parts = list(loc)
    if parts[:1] == ["axis"] and len(parts) > 1 and isinstance(parts[1], int):
        axes = raw.get("axis")
        entry = axes[parts[1]] if isinstance(axes, list) and len(axes) > parts[1] else None
        named = entry.get("name") if isinstance(entry, dict) else None
        head = f"[[axis]] {named}" if isinstance(named, str) else f"[[axis]] #{parts[1] + 1}"
        return " ".join([head, _dotted(parts[2:])]).strip()
    if parts and isinstance(parts[0], str) and parts[0] in ("study", "base", "smoke", "tune"):
        return " ".join([f"[{parts[0]}]", _dotted(parts[1:])]).strip()
    return _dotted(parts)


def _dotted(parts: list[int | str]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
