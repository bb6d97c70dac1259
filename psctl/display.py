"""Rich renderings: the live launch view, run tables and a run's detail."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from engine.analysis.cells import fmt_seconds
from engine.db.queries import EvaluationPoint, Progress, RunDetail, RunSummary, WorkerStats

STATUS_STYLE = {"running": "cyan", "finished": "green", "failed": "red",
                "interrupted": "yellow", "crashed": "magenta"}


def fmt_date(unix_s: float) -> str:
    """ISO 8601 in local time, as the dashboard shows it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


# Staleness, named the same in the terminal, the API, the charts and the docs: the number of
# updates applied to the parameters between a worker's pull and its push. SSP's --staleness
# bounds clocks (iterations), a different unit.
STALENESS = "staleness (updates since the pull)"


@dataclass(frozen=True)
class Plan:
    """What ends the run, from its config: the progress bar's total and its ETA."""

    workers: int
    servers: int
    epochs: int
    max_seconds: float | None = None
    target_accuracy: float | None = None


def progress_view(progress: Progress, plan: Plan) -> Group:
    elapsed = (progress.ended_at or progress.now) - progress.started_at
    latest = progress.latest_evaluation
    head = Text.assemble(
        (f"{progress.name}  ", "bold"), status_text(progress.status),
        f"   elapsed {fmt_seconds(elapsed)}   {progress.iterations_per_s:.1f} it/s   ",
        f"test accuracy {fmt_pct(latest.accuracy if latest else None)}",
        f" (best {fmt_pct(progress.best_accuracy)})",
    )
    table = Table(box=None, pad_edge=False)
    for column in ("worker", "epoch", "iteration", "it/s", STALENESS, "loss"):
        table.add_column(column, justify="right")
    for worker in progress.workers:
        table.add_row(str(worker.worker), f"{worker.epoch + 1}/{plan.epochs}",
                      str(worker.iteration + 1),
                      f"{worker.iterations_per_s:.1f}", str(worker.staleness),
                      "-" if worker.loss is None else f"{worker.loss:.4f}")
    return Group(head, progress_line(progress, plan, elapsed), table)


def starting_view() -> Text:
    """Before the coordinator has recorded the run."""
    return Text("start-up: starting the coordinator", style="cyan")


def progress_line(progress: Progress, plan: Plan, elapsed: float) -> RenderableType:
    """A bar with the run's total and an ETA once training runs; before, what start-up is
    waiting for."""
    start = progress.startup
    planned = start.planned_iterations if start else None
    if planned is None:
        if progress.status != "running" or start is None:
            return Text("")
        return Text(f"start-up: {start.servers_listening} of {plan.servers} servers listening, "
                    f"{start.workers_ready} of {plan.workers} workers loaded their data "
                    f"({start.processes_joined} of {plan.workers + plan.servers + 1} processes "
                    "joined)", style="cyan")
    done = progress.total_iterations
    fraction, eta, limit = done / planned, None, f"{done:,} of {planned:,} iterations"
    if progress.iterations_per_s > 0:
        eta = max(planned - done, 0) / progress.iterations_per_s
    if plan.max_seconds is not None:
        left = max(plan.max_seconds - elapsed, 0.0)
        if eta is None or left < eta:
            fraction, eta = elapsed / plan.max_seconds, left
            limit = f"time limit {fmt_seconds(plan.max_seconds)} ({done:,} of {planned:,} " \
                    "iterations)"
    fraction = min(max(fraction, 0.0), 1.0)
    parts = [f" {100 * fraction:5.1f}%  {limit}"]
    if progress.status == "running":
        parts.append(f"ETA {fmt_seconds(eta)}")
    if plan.target_accuracy is not None:
        parts.append(f"or at {fmt_pct(plan.target_accuracy)} test accuracy")
    bar = ProgressBar(total=1.0, completed=fraction, width=30)
    line = Table.grid(padding=(0, 1))
    line.add_row(bar, Text("  ·  ".join(parts)))
    return line


def runs_table(runs: list[RunSummary]) -> Table:
    table = Table(title="runs", title_justify="left")
    for column, justify in (("id", "left"), ("name", "left"), ("status", "left"),
                            ("sync", "left"), ("w×s", "right"), ("dataset", "left"),
                            ("iterations", "right"), ("best acc", "right"),
                            ("duration", "right"), ("started", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for run in runs:
        # Text, not str: Rich would read brackets in a run's name as markup.
        table.add_row(run.id[:8], Text(run.name), status_text(run.status), run.sync,
                      f"{run.workers}×{run.servers}", run.dataset, str(run.iterations),
                      fmt_pct(run.best_accuracy), fmt_seconds(run.duration_s),
                      fmt_date(run.started_at))
    return table


def detail_view(detail: RunDetail) -> Group:
    run = detail.summary
    lines: list[RenderableType] = [
        Text.assemble((f"{run.name}", "bold"), f"  {run.id}"),
        Text.assemble("status ", status_text(run.status),
                      f"   {run.sync}, {run.workers} workers × {run.servers} servers, "
                      f"{run.dataset}   duration {fmt_seconds(run.duration_s)}"),
        Text(f"best accuracy {fmt_pct(run.best_accuracy)}   final "
             f"{fmt_pct(run.final_accuracy)}   iterations {run.iterations}   "
             f"throughput {_rate(detail.totals.samples_per_s)} samples/s"),
    ]
    if detail.totals.startup_s is not None:  # training times count from the first iteration
        lines.append(Text(f"start-up {fmt_seconds(detail.totals.startup_s)} before the first "
                          f"iteration, then {fmt_seconds(detail.totals.wall_s)} of training"))
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
        lines.append(Text("faults and recovery:", style="bold"))
        lines.extend(Text(f"  {at:8.2f} s  {kind}: {what}") for at, kind, what in detail.faults)
    lines.append(_workers_table(detail))
    if detail.syncs is not None:
        lines.append(Text(
            f"ElasticBSP: {detail.syncs.barriers} barriers, mean predicted wait "
            f"{_ms(detail.syncs.predicted_wait_mean_s)}, mean actual wait "
            f"{_ms(detail.syncs.actual_wait_mean_s)}, barrier distance mean "
            f"{_iterations(detail.syncs.distance_mean)}, max {detail.syncs.distance_max} "
            f"(psctl zipline replay {run.id[:8]})"))
    if detail.layers:
        lines.append(_layers_table(detail))
    if detail.evaluations:
        lines.append(_evaluations_table(detail))
    return Group(*lines)


def _layers_table(detail: RunDetail) -> Table:
    schedule = detail.config.get("comm", {}).get("schedule", "")
    table = Table(title=f"per layer (requests scheduled {schedule})", title_justify="left",
                  caption="suspend: how long the servers held the layer's pull back; order: "
                  "its mean place in the pull schedule (0 first)", caption_justify="left")
    for column in ("layer", "pulls", "suspend mean", "suspend max", "staleness mean",
                   "staleness max", "pull order"):
        table.add_column(column, justify="right")
    for layer in detail.layers:
        table.add_row(str(layer.layer), str(layer.pulls), _ms(layer.suspend_s_mean),
                      _ms(layer.suspend_s_max), f"{layer.staleness_mean:.2f}",
                      str(layer.staleness_max), f"{layer.pull_order_mean:.2f}")
    return table


def _iterations(count: float | None) -> str:
    return "-" if count is None else f"{count:.1f} iterations"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _workers_table(detail: RunDetail) -> Table:
    # The staleness unit once, in the caption (see STALENESS), not in two long headers.
    table = Table(title="per worker (seconds are per iteration means)", title_justify="left",
                  caption=f"{STALENESS}: updates applied to the model between a worker's pull "
                  "and its push", caption_justify="left")
    # The applied learning-rate scale (runs recorded before schema 5 have none).
    scaled = any(w.lr_scale_mean is not None for w in detail.workers)
    # Push bytes before and after the push filter (runs before schema 5 have neither).
    pushed = any(w.push_reduction is not None for w in detail.workers)
    cached = any(w.pull_bytes_saved for w in detail.workers)  # SSP's cache answered reads
    for column in ("worker", "iterations", "compute", "push", "pull", "wait (idle)",
                   "idle %", "staleness mean", "staleness max", "samples/s",
                   *(("lr scale mean", "lr scale min-max") if scaled else ()),
                   *(("push KB/it", "push reduction") if pushed else ()),
                   *(("cache saved KB/it",) if cached else ())):
        table.add_column(column, justify="right")
    if scaled:
        table.caption = (f"{table.caption}\nlr scale: the factor the servers applied each "
                         "gradient with (aggregator weight x schedule x staleness rule)")
    for w in detail.workers:
        table.add_row(str(w.worker), str(w.iterations), f"{w.compute_s_mean * 1e3:.1f} ms",
                      f"{w.push_s_mean * 1e3:.1f} ms", f"{w.pull_s_mean * 1e3:.1f} ms",
                      f"{w.wait_s_mean * 1e3:.1f} ms", fmt_pct(w.idle_fraction),
                      f"{w.staleness_mean:.2f}", str(w.staleness_max), _rate(w.samples_per_s),
                      *(_lr_cells(w) if scaled else ()), *(_push_cells(w) if pushed else ()),
                      *((f"{(w.pull_bytes_saved or 0) / w.iterations / 1e3:,.1f}",)
                        if cached else ()))
    if pushed:
        table.caption = (f"{table.caption}\npush reduction: dense float32 push bytes / push "
                         "bytes sent (the push filter's saving; 1.0x without one)")
    if cached:
        table.caption = (f"{table.caption}\ncache saved: the pull bytes of the reads the "
                         "worker's cache answered within the staleness bound (--no-cache: none)")
    return table


def _push_cells(w: WorkerStats) -> tuple[str, str]:
    if w.push_bytes is None or w.push_reduction is None:
        return "-", "-"
    return f"{w.push_bytes / w.iterations / 1e3:,.1f}", f"{w.push_reduction:.1f}x"


def _lr_cells(w: WorkerStats) -> tuple[str, str]:
    if w.lr_scale_mean is None or w.lr_scale_min is None or w.lr_scale_max is None:
        return "-", "-"
    return f"{w.lr_scale_mean:.4g}", f"{w.lr_scale_min:.4g}-{w.lr_scale_max:.4g}"


# Up to this many evaluations are listed whole; a longer run lists a sample of them.
EVALUATIONS_SHOWN = 20


def shown_evaluations(points: Sequence[EvaluationPoint], limit: int = EVALUATIONS_SHOWN) -> \
        list[EvaluationPoint]:
    """All of ``points`` if they fit, else evenly spaced ones that always include the first,
    the best (the accuracy the header quotes) and the last; in time order."""
    if len(points) <= limit:
        return list(points)
    best = max(range(len(points)), key=lambda i: (points[i].accuracy, -i))
    last = len(points) - 1
    # limit - 1 evenly spaced (the first and the last among them), plus the best.
    keep = {round(k * last / (limit - 2)) for k in range(limit - 1)} | {best}
    return [points[i] for i in sorted(keep)]


def _evaluations_table(detail: RunDetail) -> Table:
    points = detail.evaluations
    shown = shown_evaluations(points)
    caption = None
    if len(shown) < len(points):
        # A caption, not the title: a title would wrap to the narrow table's width.
        caption = (f"{len(shown)} of {len(points)} shown, including the best and the last; "
                   "--json lists all")
    table = Table(title="test evaluations", title_justify="left", caption=caption,
                  caption_justify="left")
    for column in ("elapsed", "epoch", "step", "accuracy", "loss", ""):
        table.add_column(column, justify="right")
    best = max(p.accuracy for p in points)
    for point in shown:
        mark = "best" if point.accuracy == best else ""
        table.add_row(fmt_seconds(point.elapsed_s), f"{point.epoch:.2f}", str(point.step),
                      fmt_pct(point.accuracy), f"{point.loss:.4f}", mark,
                      style="bold green" if mark else "")
    return table


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def as_jsonable(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value
