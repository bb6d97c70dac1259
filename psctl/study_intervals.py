"""A study's seeds summed up (``repeat`` > 1): per grid point, each metric's mean and 95 %
interval over its seeds, and its ratio to the baseline point (the grid's first), paired by
seed, with a verdict (engine.analysis.intervals has the method)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from engine.analysis.intervals import Interval, Ratio, interval, paired_ratio
from psctl.study_rows import Row

# (key, header, lower is better, the verdict when better, when worse)
METRICS = (("time_to_target_s", "to target (s)", True, "faster", "slower"),
           ("final_accuracy", "final acc", False, "higher", "lower"),
           ("best_accuracy", "best acc", False, "higher", "lower"),
           ("samples_per_s", "samples/s", False, "higher", "lower"))
METHOD = ("95 % intervals: Student t over seeds (mean ± t(0.975, n-1) s/sqrt(n)); ratios to the "
          "baseline paired by seed, t over the per-seed log ratios, exponentiated; a time's "
          "ratio is the baseline's over the point's (> 1: faster)")


def points(rows: list[Row]) -> list[tuple[dict[str, str], list[Row]]]:
    """The rows of each grid point, in the grid's order."""
    found: dict[tuple[tuple[str, str], ...], list[Row]] = {}
    for row in rows:
        found.setdefault(tuple(sorted(row.labels.items())), []).append(row)
    return [(dict(key), members) for key, members in found.items()]


def _by_seed(rows: list[Row], key: str) -> dict[int, float | None]:
    return {row.seed if row.seed is not None else i: _value_of(row, key)
            for i, row in enumerate(rows)}


def metrics(rows: list[Row]) -> tuple[tuple[str, str, bool, str, str], ...]:
    """``METRICS``, and under a budget in seconds the accuracy at each of its marks."""
    marks = rows[0].mark_accuracy if rows else {}
    return (*METRICS, *((f"acc@{mark}", f"acc at {mark}", False, "higher", "lower")
                        for mark in marks))


def _value_of(row: Row, key: str) -> float | None:
    if key.startswith("acc@"):
        return row.mark_accuracy.get(key.removeprefix("acc@"))
    value: float | None = getattr(row, key)
    return value


def summary(rows: list[Row], baseline: dict[str, str] | None = None) -> dict[str, Any]:
    """Each point's intervals and its ratios to its baseline: the point with ``baseline``'s
    labels and its own on the other axes, or the grid's first point."""
    grouped = points(rows)
    if not grouped:
        return {"method": METHOD, "baseline": None, "points": []}
    by_labels = {tuple(sorted(labels.items())): members for labels, members in grouped}
    out = []
    for labels, members in grouped:
        wanted = tuple(sorted((labels | (baseline or {})).items()))
        base = by_labels.get(wanted, []) if baseline else grouped[0][1]
        stats: dict[str, Any] = {}
        versus: dict[str, Any] = {}
        for key, _, lower, better, worse in metrics(rows):
            bounds = (0.0, 1.0) if "acc" in key else (0.0, math.inf)
            found = interval([_value_of(r, key) for r in members], bounds)
            stats[key] = None if found is None else asdict(found)
            ratio = paired_ratio(_by_seed(base, key), _by_seed(members, key),
                                 lower_is_better=lower, better=better, worse=worse)
            versus[key] = None if ratio is None or base is members else asdict(ratio)
        out.append({"labels": labels, "seeds": [r.seed for r in members], "metrics": stats,
                    "versus_baseline": versus, "is_baseline": base is members})
    return {"method": METHOD, "baseline": baseline or grouped[0][0], "points": out}


def markdown(rows: list[Row], axes: list[str],
             baseline: dict[str, str] | None = None) -> list[str]:
    """Two tables: each point's means with intervals, and its paired ratios to its baseline."""
    data = summary(rows, baseline)
    if not data["points"]:
        return []
    base = ", ".join(f"{k} {v}" for k, v in data["baseline"].items())
    which = (f"each point's {base} point (the same on every other axis)" if baseline else
             f"the grid's first point ({base})")
    shown = metrics(rows)
    heads = [*axes, "seeds", *(header for _, header, *_ in shown)]
    lines = ["## Over seeds", "", f"{METHOD}. Baseline: {which}.", "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for point in data["points"]:
        cells = [point["labels"].get(a, "") for a in axes] + [str(len(point["seeds"]))]
        cells += [_interval(point["metrics"][key], key) for key, *_ in shown]
        lines.append("| " + " | ".join(cells) + " |")
    heads = [*axes, *(f"{header} vs baseline" for _, header, *_ in shown)]
    lines += ["", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for point in (p for p in data["points"] if not p["is_baseline"]):
        cells = [point["labels"].get(a, "") for a in axes]
        cells += [_ratio(point["versus_baseline"][key]) for key, *_ in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _value(value: float, key: str) -> str:
    if key.endswith("accuracy") or key.startswith("acc@"):
        return f"{100 * value:.2f}%"
    return f"{value:,.1f}"


def _interval(found: dict[str, Any] | None, key: str) -> str:
    if found is None:
        return "not reached" if key == "time_to_target_s" else "-"
    item = Interval(**found)
    if item.low is None or item.high is None:
        return _value(item.mean, key)
    return f"{_value(item.mean, key)} [{_value(item.low, key)}, {_value(item.high, key)}]"


def _ratio(found: dict[str, Any] | None) -> str:
    if found is None:
        return "-"
    item = Ratio(**found)
    if item.low is None or item.high is None:
        return f"{item.ratio:.2f}x ({item.verdict})"
    return f"{item.ratio:.2f}x [{item.low:.2f}, {item.high:.2f}], {item.verdict}"
