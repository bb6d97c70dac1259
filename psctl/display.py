"""Rich renderings: the live launch view, run tables and a run's detail."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from engine.db.queries import Progress, RunDetail, RunSummary

STATUS_STYLE = {"running": "cyan", "finished": "green", "failed": "red",
                "interrupted": "yellow", "crashed": "magenta"}


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def progress_view(progress: Progress, *, epochs: int, iterations_per_epoch: int | None) -> Group:
    elapsed = (progress.ended_at or time.time()) - progress.started_at
    latest = progress.latest_evaluation
    head = Text.assemble(
        (f"{progress.name}  ", "bold"), status_text(progress.status),
        f"   elapsed {fmt_seconds(elapsed)}   {progress.iterations_per_s:.1f} it/s   ",
        f"test accuracy {fmt_pct(latest.accuracy if latest else None)}",
        f" (best {fmt_pct(progress.best_accuracy)})",
    )
    table = Table(box=None, pad_edge=False)
    for column in ("worker", "epoch", "iteration", "it/s", "staleness", "loss"):
        table.add_column(column, justify="right")
    for worker in progress.workers:
        epoch = f"{worker.epoch + 1}/{epochs}"
        table.add_row(str(worker.worker), epoch, str(worker.iteration + 1),
                      f"{worker.iterations_per_s:.1f}", str(worker.staleness),
                      "-" if worker.loss is None else f"{worker.loss:.4f}")
    if not progress.workers:
        table.add_row("-", "starting", "", "", "", "")
    return Group(head, table)


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
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at)))
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
    if detail.reason:
        lines.append(Text(f"reason: {detail.reason}", style="yellow"))
    lines.append(_workers_table(detail))
    if detail.syncs is not None:
        lines.append(Text(
            f"ElasticBSP: {detail.syncs.barriers} barriers, mean predicted wait "
            f"{_ms(detail.syncs.predicted_wait_mean_s)}, mean actual wait "
            f"{_ms(detail.syncs.actual_wait_mean_s)} (psctl zipline replay {run.id[:8]})"))
    if detail.evaluations:
        lines.append(_evaluations_table(detail))
    return Group(*lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _workers_table(detail: RunDetail) -> Table:
    table = Table(title="per worker (seconds are per iteration means)", title_justify="left")
    for column in ("worker", "iterations", "compute", "push", "pull", "wait (idle)",
                   "idle %", "staleness mean", "staleness max", "samples/s"):
        table.add_column(column, justify="right")
    for w in detail.workers:
        table.add_row(str(w.worker), str(w.iterations), f"{w.compute_s_mean * 1e3:.1f} ms",
                      f"{w.push_s_mean * 1e3:.1f} ms", f"{w.pull_s_mean * 1e3:.1f} ms",
                      f"{w.wait_s_mean * 1e3:.1f} ms", fmt_pct(w.idle_fraction),
                      f"{w.staleness_mean:.2f}", str(w.staleness_max), _rate(w.samples_per_s))
    return table


def _evaluations_table(detail: RunDetail, limit: int = 12) -> Table:
    table = Table(title="test evaluations", title_justify="left")
    for column in ("elapsed", "epoch", "step", "accuracy", "loss"):
        table.add_column(column, justify="right")
    points = detail.evaluations
    shown = points if len(points) <= limit else points[:: max(len(points) // limit, 1)]
    if shown[-1] is not points[-1]:
        shown = (*shown, points[-1])
    for point in shown:
        table.add_row(fmt_seconds(point.elapsed_s), f"{point.epoch:.2f}", str(point.step),
                      fmt_pct(point.accuracy), f"{point.loss:.4f}")
    return table


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def as_jsonable(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value
