"""Rich renderings: the live launch view, run tables and a run's detail."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from engine.analysis.cells import fmt_seconds
from engine.db.queries import Progress, RunDetail, RunSummary
from psctl.detail_tables import (
    STALENESS,
    evaluations_table,
    fmt_loss,
    layers_table,
    memory_line,
    ms,
    rate,
    stored_line,
    workers_table,
)
from psctl.detail_tables import fmt_pct as fmt_pct  # where the launch summary takes it from
from psctl.detail_tables import fmt_target as fmt_target  # and compare
from psctl.progress_line import Plan as Plan  # and the launch's live view
from psctl.progress_line import Words, progress_line
from psctl.tables import Col, FitTable

STATUS_STYLE = {"running": "cyan", "finished": "green", "failed": "red",
                "interrupted": "yellow", "crashed": "magenta"}


def fmt_date(unix_s: float) -> str:
    """ISO 8601 in local time, as the dashboard shows it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def progress_view(progress: Progress, plan: Plan) -> Group:
    elapsed = (progress.ended_at or progress.now) - progress.started_at
    latest = progress.latest_evaluation
    head = Words(
        Text.assemble((f"{progress.name}  ", "bold"), status_text(progress.status)),
        Text(f"   {_elapsed(progress, elapsed)}"),
        Text(f"   {progress.iterations_per_s:.1f} it/s"),
        Text(f"   test accuracy {fmt_pct(latest.accuracy if latest else None)} "
             f"(best {fmt_pct(progress.best_accuracy)})"),
    )
    table = FitTable(PROGRESS_COLUMNS, [
        (str(worker.worker), _epoch(worker.epoch, plan), str(worker.iteration + 1),
         f"{worker.iterations_per_s:.1f}", str(worker.staleness),
         fmt_loss(worker.loss))
        for worker in progress.workers], boxed=False)
    return Group(head, progress_line(progress, plan, elapsed), table)


def _epoch(epoch: int, plan: Plan) -> str:
    """The worker's epoch of the run's: under a budget, its passes so far (no planned count)."""
    return str(epoch + 1) if plan.budget is not None else f"{epoch + 1}/{plan.epochs}"


PROGRESS_COLUMNS = (Col("worker"), Col("epoch"), Col("iteration"), Col("it/s"),
                    Col(STALENESS, short="staleness"), Col("loss"))


def _elapsed(progress: Progress, elapsed: float) -> str:
    """The run's time so far, and how much of it was start-up (not training)."""
    if progress.startup_s is None:
        return f"elapsed {fmt_seconds(elapsed)}"
    return f"elapsed {fmt_seconds(elapsed)} (start-up {fmt_startup(progress.startup_s)})"


def starting_view() -> Text:
    """Before the coordinator has recorded the run."""
    return Text("start-up: starting the coordinator", style="cyan")


# The runs list's columns; on a narrow screen the start time goes first, then the counts.
RUNS_COLUMNS = (Col("id", "left"), Col("name", "left"), Col("status", "left"),
                Col("sync", "left"), Col("w×s", rank=2), Col("dataset", "left", rank=1),
                Col("iterations", short="iters", rank=3), Col("best acc", short="best"),
                Col("duration", short="time"), Col("started", "left", rank=4))
SIMULATED_MARK = " (sim)"
SIMULATED_NOTE = "(sim): simulated in virtual time; its times are not this machine's"


def runs_table(runs: Sequence[RunSummary], simulated: frozenset[str] = frozenset()) -> FitTable:
    """The runs list; the ids in ``simulated`` ran on a virtual clock and are marked so."""
    rows = [(run.id[:8], Text(run.name),  # Text, not str: "[x]" in a name is not markup
             status_text(run.status) + (SIMULATED_MARK if run.id in simulated else ""),
             run.sync, f"{run.workers}×{run.servers}", run.dataset, str(run.iterations),
             fmt_pct(run.best_accuracy), fmt_seconds(run.duration_s), fmt_date(run.started_at))
            for run in runs]
    notes = (SIMULATED_NOTE,) if any(run.id in simulated for run in runs) else ()
    return FitTable(RUNS_COLUMNS, rows, title="runs", notes=notes)


def _head(detail: RunDetail) -> list[RenderableType]:
    """The run's name, status, shape and outcome; a simulated run's times said to be virtual."""
    run = detail.summary
    virtual = " of virtual time" if detail.simulated else ""
    target = detail.config.get("stop", {}).get("target_accuracy")
    return [
        Text.assemble((f"{run.name}", "bold"), f"  {run.id}",
                      ("  simulated", "cyan") if detail.simulated else ""),
        Text.assemble("status ", status_text(run.status),
                      f"   {run.sync}, {run.workers} workers × {run.servers} servers, "
                      f"{run.dataset}   duration {fmt_seconds(run.duration_s)}{virtual}"),
        Text(f"best accuracy {fmt_pct(run.best_accuracy)}   final "
             f"{fmt_pct(run.final_accuracy)}   iterations {run.iterations}   "
             f"throughput {rate(detail.totals.samples_per_s)} samples/s"),
        # A line of its own, where "97 %" is never split by wrapping.
        *((Text(f"stops at {fmt_target(target)} test accuracy"),) if target is not None else ()),
    ]


def detail_view(detail: RunDetail) -> Group:
    run = detail.summary
    lines = [*_head(detail), *_clock_lines(detail)]
    if detail.memory is not None:  # runs recorded before schema 8 read no PSS
        lines.append(Text(memory_line(detail.memory)))
    if detail.stored is not None and detail.stored.sparse:
        lines.append(Text(stored_line(detail.stored)))
    if detail.reason:
        lines.append(Text(f"reason: {detail.reason}", style="yellow"))
    if detail.oversubscribed:
        lines.append(Text(f"oversubscribed: {detail.oversubscribed}", style="yellow"))
    if detail.simulated:
        lines.append(Text(f"simulated in virtual time: {detail.simulated}", style="cyan"))
    if detail.notes:
        lines.append(Text(f"notes: {detail.notes}"))
    if len(detail.nodes) > 1:  # spread over several nodes (a Ray cluster, psctl role)
        lines.append(Text("nodes: " + "; ".join(f"{node}: {', '.join(names)}"
                                                for node, names in detail.nodes)))
    if detail.faults:
        lines.append(Text("faults and recovery (seconds of training; before 0: start-up):",
                          style="bold"))
        lines.extend(Text(f"  {at:8.2f} s  {kind}: {what}") for at, kind, what in detail.faults)
    lines.append(workers_table(detail))
    if detail.syncs is not None:
        lines.append(Text(
            f"ElasticBSP: {detail.syncs.barriers} barriers, mean predicted wait "
            f"{ms(detail.syncs.predicted_wait_mean_s)}, mean actual wait "
            f"{ms(detail.syncs.actual_wait_mean_s)}, barrier distance mean "
            f"{_iterations(detail.syncs.distance_mean)}, max {detail.syncs.distance_max} "
            f"(psctl zipline replay {run.id[:8]})"))
    if detail.layers:
        lines.append(layers_table(detail))
    if detail.evaluations:
        lines.append(evaluations_table(detail))
    return Group(*lines)


def _clock_lines(detail: RunDetail) -> list[Text]:
    """The run's one time base (engine/db/clock.py): start-up as one number, then its training;
    where start-up went; and a resumed run's downtime, said as such. Every time below counts
    seconds of training from the first iteration."""
    totals, lines = detail.totals, []
    if totals.startup_s is not None:
        since = "the command's start" if detail.start_up is not None else "the run's start"
        lines.append(Text(f"start-up {fmt_startup(totals.startup_s)} (from {since} to the first "
                          f"iteration), then {fmt_seconds(totals.wall_s)} of training"))
    if detail.start_up is not None:
        lines.append(Text(detail.start_up.describe()))
    lines.extend(Text(f"down {fmt_seconds(span['seconds'])} after {fmt_seconds(span['training_s'])}"
                      " of training (to psctl resume and its first iteration): left out of "
                      "every training time", style="yellow") for span in detail.downtime)
    return lines


def fmt_startup(seconds: float) -> str:
    """Start-up, in seconds (it is seconds long): the runs table and compare write it alike."""
    return f"{seconds:.1f} s"


def _iterations(count: float | None) -> str:
    return "-" if count is None else f"{count:.1f} iterations"


def as_jsonable(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value
