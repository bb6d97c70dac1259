"""A study's ``[tune]`` in its report: each point's best setting, its robustness (the share of
settings that reached the target) and every setting tried, in report.md and summary.json."""

from __future__ import annotations

from typing import Any

from engine.analysis.selection import flatten
from psctl.study import Study
from psctl.study_tune import PENALTY, Tuned, shown


def summary(study: Study, tunings: list[Tuned]) -> dict[str, Any]:
    spec = study.spec.tune
    assert spec is not None
    return {
        "method": spec.method, "objective": spec.objective, "seeds": spec.seeds,
        "set": flatten(spec.set), "params": [p.model_dump(exclude_none=True) for p in spec.param],
        "missed_target_counts": f"{PENALTY:g} x the run's duration",
        "points": [{
            "labels": dict(t.point.labels),
            "best": None if t.best is None else t.best.trial.params,
            "best_score": None if t.best is None else t.best.score,
            "reached_share": t.reached_share,
            "tried": [{"index": one.trial.index, "params": one.trial.params, "score": one.score,
                       "reached": one.reached, "runs": [r.run_id for r in one.rows]}
                      for one in t.tried]} for t in tunings]}


def markdown(study: Study, tunings: list[Tuned]) -> list[str]:
    spec = study.spec.tune
    assert spec is not None
    target = f"{study.spec.study.target:.0%}"
    how = ("every combination of the values" if spec.method == "grid" else
           f"{spec.trials} settings drawn by Optuna's TPE sampler (seeded per point)")
    scored = {"time_to_target": f"mean seconds to {target} over the seeds (a seed that missed "
                                f"it counts {PENALTY:g}x its run's duration; lower is better)",
              "final_accuracy": "mean final test accuracy over the seeds",
              "best_accuracy": "mean best test accuracy over the seeds"}[spec.objective]
    under = ", ".join(f"{k} = {v}" for k, v in flatten(spec.set).items()) or "the study's settings"
    axes = study.axes
    lines = ["## Tuning", "",
             f"Each point was tried at {how}, on {spec.seeds} seeds of its own (not the main "
             f"runs'), under {under}; score: {scored}. The main runs use each point's best "
             f"setting. Reached: the settings whose every seed reached {target} (robustness).",
             "", "| " + " | ".join([*axes, "best setting", "score", "reached"]) + " |",
             "|" + "---|" * (len(axes) + 3)]
    for tuned in tunings:
        best, share = tuned.best, tuned.reached_share
        reached = sum(t.reached for t in tuned.tried)
        cells = [dict(tuned.point.labels).get(a, "") for a in axes]
        cells += ["-" if best is None else shown(best.trial.params),
                  "-" if best is None else _score(best.score, spec.objective),
                  f"{reached} of {len(tuned.tried)}"
                  + ("" if share is None else f" ({share:.0%})")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Every setting tried:", "",
              "| " + " | ".join([*axes, "setting", "score", "reached"]) + " |",
              "|" + "---|" * (len(axes) + 3)]
    for tuned in tunings:
        for one in tuned.tried:
            cells = [dict(tuned.point.labels).get(a, "") for a in axes]
            cells += [shown(one.trial.params), _score(one.score, spec.objective),
                      "yes" if one.reached else "no"]
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _score(value: float | None, objective: str) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} s" if objective == "time_to_target" else f"{100 * value:.2f}%"
