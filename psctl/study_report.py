"""A study's report: ``report.md`` (a table with a row per run, then the plots) and
``summary.json`` (the same table, for documents that quote its numbers), measured through the
same queries as ``psctl runs show`` and ``psctl compare``."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psctl import study_intervals, study_tune_report
from psctl.study import Study
from psctl.study_outcomes import Progress
from psctl.study_rows import Row

if TYPE_CHECKING:
    from engine.db.queries import RunDetail
    from psctl.study_tune import Tuned


@dataclass(frozen=True)
class Wall:
    """This invocation's wall time: the runs it ran, ``jobs`` at a time where they could, and
    those it kept from an interrupted one (``--resume``), whose time is not counted."""

    seconds: float
    jobs: int
    ran: int
    kept: int = 0

    def text(self) -> str:
        kept = f"; {self.kept} runs kept from before, not counted" if self.kept else ""
        return (f"{self.seconds / 60:.1f} min for {self.ran} runs (up to {self.jobs} at a "
                f"time in virtual time){kept}")


@dataclass(frozen=True)
class Header:
    command: str
    study_id: str
    smoke: bool
    wall: Wall | None = None  # None: a report written again from the database (--report)
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M"))


def collect(db: Path, progress: Progress, target: float) -> list[Row]:
    from engine.db import open_engine
    from engine.db.metrics import run_metrics
    from engine.db.queries import epoch_time_s, reading, run_detail

    engine = open_engine(db, readonly=True)
    rows = []
    try:
        for outcome in progress.outcomes:
            detail = run_detail(engine, outcome.run_id)
            with reading(engine, "reading a run's epoch time") as conn:
                per_epoch = epoch_time_s(conn, outcome.run_id)
            metrics = run_metrics(engine, outcome.run_id, target=target)
            run, evals = detail.summary, detail.evaluations
            rows.append(Row(
                labels=dict(outcome.planned.point.labels), seed=outcome.planned.seed,
                run_id=run.id, name=run.name, status=run.status,
                time_to_target_s=metrics.time_to_target_s, final_accuracy=run.final_accuracy,
                best_accuracy=run.best_accuracy, iterations=run.iterations,
                epochs=evals[-1].epoch if evals else None,
                idle_fraction=metrics.idle_fraction, staleness_mean=metrics.staleness_mean,
                bytes_per_sample=metrics.bytes_per_sample, duration_s=run.duration_s,
                epoch_time_s=per_epoch, samples_per_s=metrics.samples_per_s,
                mark_accuracy=mark_accuracy(outcome.planned.config.stop.budget, detail),
                evaluations=[(e.elapsed_s, e.step, e.accuracy) for e in evals]))
    finally:
        engine.dispose()
    return rows


def mark_accuracy(budget_text: str | None, detail: RunDetail) -> dict[str, float | None]:
    """Test accuracy at each mark of a budget in seconds (engine.budget.MARKS, then the end):
    the evaluation nearest to the mark in seconds of training; empty for another budget."""
    from engine.budget import MARKS, budget_of

    budget = budget_of(budget_text)
    evals, workers = detail.evaluations, detail.workers
    if budget is None or budget.unit != "s" or not evals or not workers:
        return {}
    found: dict[str, float | None] = {}
    for fraction in MARKS:
        mark = fraction * budget.amount
        nearest = min(evals, key=lambda e: abs((e.training_s or 0.0) - mark))
        found[f"{fraction:.0%}"] = nearest.accuracy
    found["100%"] = evals[-1].accuracy
    return found


def write_report(out: Path, study: Study, progress: Progress, rows: list[Row],
                 header: Header, tunings: list[Tuned] | None = None) -> Path:
    """report.md, its PNGs and summary.json in ``out``; returns report.md's path."""
    from psctl.study_plots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    backends = sorted({o.planned.config.cluster.backend for o in progress.outcomes})
    summary = _summary(study, progress, rows, header, backends)
    if tunings is not None:
        summary["tuning"] = study_tune_report.summary(study, tunings)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    try:
        plots, note = write_plots(out, rows, study.axes, study.spec.study.target), None
    except ImportError:  # matplotlib is a development dependency, not a runtime one
        plots, note = [], "Plots skipped: matplotlib is not installed (pip install matplotlib)."
    path = out / "report.md"
    text = _markdown(study, progress, rows, header, backends, plots, note)
    if tunings is not None:
        text += "\n" + "\n".join(study_tune_report.markdown(study, tunings))
    path.write_text(text)
    return path


def _summary(study: Study, progress: Progress, rows: list[Row], header: Header,
             backends: list[str]) -> dict[str, Any]:
    meta = study.spec.study
    return {
        "study": meta.name, "title": meta.title, "seed_doc": meta.seed_doc,
        "study_id": header.study_id, "command": header.command, "date": header.date,
        "smoke": header.smoke, "backends": backends, "target": meta.target,
        "axes": study.axes, "planned_runs": progress.total, "complete": progress.complete,
        "interrupted": progress.interrupted,
        "wall": None if header.wall is None else asdict(header.wall),
        "rows": [{k: v for k, v in asdict(row).items() if k != "evaluations"} for row in rows],
        **({"over_seeds": study_intervals.summary(rows, meta.baseline)} if meta.repeat > 1 else {}),
    }


_COLUMNS = ("status", "to target (s)", "epoch time (s)", "final acc", "best acc", "iterations",
            "epochs", "idle", "mean staleness", "bytes/sample", "run")


def _markdown(study: Study, progress: Progress, rows: list[Row], header: Header,
              backends: list[str], plots: list[tuple[str, str]], note: str | None) -> str:
    meta = study.spec.study
    lines = [f"# {meta.title}", ""]
    facts = [f"Study `{meta.name}`" + (f", reproducing seed document {meta.seed_doc}"
                                       if meta.seed_doc else ""),
             f"command: `{header.command}`", f"date: {header.date}",
             f"backend: {', '.join(backends) or '-'}", f"study id: `{header.study_id}`",
             "wall time: " + ("not measured (written again from the database)"
                              if header.wall is None else header.wall.text())]
    lines += [f"- {fact}" for fact in facts] + [""]
    if meta.description:
        lines += [meta.description.strip(), ""]
    if header.smoke:
        lines += ["A smoke run (`--smoke`): the grid at reduced size, to check that the study "
                  "runs; its numbers are not the study's results.", ""]
    ran = f"{len(rows)} of {progress.total} runs"
    if progress.interrupted:
        lines += [f"**Interrupted**: {ran} ran; the table shows those.", ""]
    elif any(row.status != "finished" for row in rows):
        lines += [f"{ran}; not every run finished (see status).", ""]
    lines += [f"Time to target: seconds of training, from the run's first iteration, to the "
              f"first evaluation with test "
              f"accuracy ≥ {meta.target:.0%}. Idle: time workers waited for the consistency "
              "model, as a share of their iterations' wall time. Staleness: updates applied "
              "between a worker's pull and its push. Epoch time: seconds until the workers "
              "together had run one epoch's iterations (a pass over the data, whoever ran "
              "it).", ""]
    heads = [*study.axes, *(["seed"] if meta.repeat > 1 else []), *_COLUMNS]
    lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(_cells(row, study.axes, meta.repeat > 1)) + " |" for row in rows]
    lines.append("")
    if meta.repeat > 1:
        lines += study_intervals.markdown(rows, study.axes, meta.baseline)
    for file, caption in plots:
        lines += [f"![{caption}]({file})", ""]
    if note:
        lines += [note, ""]
    lines += [f"Every run is tagged `study_id={header.study_id}`: `psctl compare --where "
              f"study_id={header.study_id} --target {meta.target}` lists them again.", ""]
    return "\n".join(lines)


def _cells(row: Row, axes: list[str], seeded: bool) -> list[str]:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}%"

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    reached = "not reached" if row.time_to_target_s is None else f"{row.time_to_target_s:.1f}"
    cells = [row.labels.get(axis, "") for axis in axes]
    cells += [str(row.seed)] if seeded else []
    cells += [row.status, reached, num(row.epoch_time_s, ".1f"), pct(row.final_accuracy),
              pct(row.best_accuracy),
              f"{row.iterations:,}", num(row.epochs, ".2f"), pct(row.idle_fraction),
              num(row.staleness_mean, ".2f"), num(row.bytes_per_sample, ",.0f"),
              f"`{row.run_id[:8]}`"]
    return [cell.replace("|", "\\|") for cell in cells]
