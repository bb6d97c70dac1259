"""The tables of ``psctl runs show``: per worker, per layer and the test evaluations, each laid
out for the screen's width (psctl.tables): on a narrow one the counts and the less read
columns go first, and a note names what is not shown."""

from __future__ import annotations

from collections.abc import Sequence

from engine.analysis.cells import fmt_seconds
from engine.db.memory import MemoryPeak
from engine.db.queries import EvaluationPoint, RunDetail, WorkerStats
from engine.db.stored import StoredKeys
from psctl.tables import Col, FitTable

# Staleness, named the same in the terminal, the API, the charts and the docs: the number of
# updates applied to the parameters between a worker's pull and its push. SSP's --staleness
# bounds clocks (iterations), a different unit.
STALENESS = "staleness (updates since the pull)"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def fmt_target(accuracy: float) -> str:
    """A target accuracy as every view writes it: in percent, 0.97 as "97 %"."""
    return f"{100 * accuracy:.4g} %"


def fmt_loss(value: float | None) -> str:
    """A loss to four decimals, or to four significant digits once it is large (a diverging
    model's 4.5e+17, not eighteen digits that push the table off the screen)."""
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def fmt_bytes(count: float) -> str:
    """Binary units, three significant digits: 3.21 GiB, 31.4 GiB, 22.0 MiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            value = count / scale
            return f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f} {unit}"
    return f"{count:.0f} B"


def memory_line(peak: MemoryPeak) -> str:
    """The run's summed PSS at its peak, beside the RSS the same processes summed to then."""
    per_role = ", ".join(f"per {role} {fmt_bytes(peak.pss_by_role[role])}"
                         for role in ("worker", "server") if role in peak.pss_by_role)
    when = (f"at {fmt_seconds(peak.at)} of training" if peak.at >= 0
            else f"in start-up, {-peak.at:.1f} s before the first iteration")
    return (f"memory at the peak ({when}): "
            f"{fmt_bytes(peak.peak_pss_bytes)} proportional (PSS) over {peak.processes} "
            f"process{'' if peak.processes == 1 else 'es'} (RSS summed "
            f"{fmt_bytes(peak.rss_bytes)}, counting shared pages in each)"
            + (f"; {per_role}" if per_role else "")
            + (f"; {peak.unread} more had no PSS reading yet, not counted" if peak.unread
               else ""))


def stored_line(stored: StoredKeys) -> str:
    """What the servers stored: the keys pushed, for a sparse range, and their bytes each."""
    kind = "sparse: only keys pushed are stored" if stored.sparse else "dense"
    each = f", {stored.bytes / stored.keys:.0f} bytes a key" if stored.keys else ""
    return (f"keys the servers stored: {stored.keys:,} ({kind}){each}: "
            f"{fmt_bytes(stored.bytes)} of values, optimizer state and key maps")


LAYER_COLUMNS = (Col("layer"), Col("pulls", rank=1), Col("suspend mean", short="suspend"),
                 Col("suspend max", short="susp max", rank=2),
                 Col("staleness mean", short="stale"),
                 Col("staleness max", short="stale max", rank=2),
                 Col("pull order", short="order"))


def layers_table(detail: RunDetail) -> FitTable:
    schedule = detail.config.get("comm", {}).get("schedule", "")
    rows = [(str(layer.layer), str(layer.pulls), ms(layer.suspend_s_mean),
             ms(layer.suspend_s_max), f"{layer.staleness_mean:.2f}", str(layer.staleness_max),
             f"{layer.pull_order_mean:.2f}") for layer in detail.layers]
    return FitTable(LAYER_COLUMNS, rows, title=f"per layer (requests scheduled {schedule})",
                    notes=("suspend: how long the servers held the layer's pull back; order: "
                           "its mean place in the pull schedule (0 first)",))


STALENESS_NOTE = f"{STALENESS}: updates applied to the model between a worker's pull and its push"
# What every run has: the time split of an iteration first (never put away), then the counts.
WORKER_COLUMNS = (Col("worker"), Col("iterations", short="iters", rank=3),
                  Col("compute"), Col("push"), Col("pull"),
                  Col("wait (idle)", short="wait"), Col("idle %", short="idle", rank=1),
                  Col("staleness mean", short="stale", rank=2, note=STALENESS_NOTE),
                  Col("staleness max", short="stale max", rank=4, note=STALENESS_NOTE),
                  Col("samples/s", short="smp/s", rank=1))
# Columns a run has only with these features, each with the note that explains it.
LR_NOTE = ("lr scale: the factor the servers applied each gradient with (aggregator weight x "
           "schedule x staleness rule)")
LR_COLUMNS = (Col("lr scale mean", short="lr scale", rank=5, note=LR_NOTE),
              Col("lr scale min-max", short="lr min-max", rank=6, note=LR_NOTE))
PUSH_NOTE = ("push reduction: dense float32 push bytes / push bytes sent (the push filter's "
             "saving; 1.0x without one)")
PUSH_COLUMNS = (Col("push KB/it", short="push KB", rank=5),
                Col("push reduction", short="push red", rank=5, note=PUSH_NOTE))
CACHE_NOTE = ("cache saved: the pull bytes of the reads the worker's cache answered within the "
              "staleness bound (--no-cache: none)")
CACHE_COLUMNS = (Col("cache saved KB/it", short="cache KB", rank=5, note=CACHE_NOTE),)


def workers_table(detail: RunDetail) -> FitTable:
    workers = detail.workers
    # The applied learning-rate scale (runs recorded before schema 5 have none); push bytes
    # before and after the push filter (neither before schema 5); SSP's cache answered reads.
    scaled = any(w.lr_scale_mean is not None for w in workers)
    pushed = any(w.push_reduction is not None for w in workers)
    cached = any(w.pull_bytes_saved for w in workers)
    columns = (*WORKER_COLUMNS, *(LR_COLUMNS if scaled else ()),
               *(PUSH_COLUMNS if pushed else ()), *(CACHE_COLUMNS if cached else ()))
    rows = [(*_worker_cells(w), *(_lr_cells(w) if scaled else ()),
             *(_push_cells(w) if pushed else ()), *((_cache_cell(w),) if cached else ()))
            for w in workers]
    # The staleness unit once, in a note (see STALENESS), not in two long headers.
    return FitTable(columns, rows, title="per worker (seconds are per iteration means)")


def _worker_cells(w: WorkerStats) -> tuple[str, ...]:
    return (str(w.worker), str(w.iterations), ms(w.compute_s_mean), ms(w.push_s_mean),
            ms(w.pull_s_mean), ms(w.wait_s_mean), fmt_pct(w.idle_fraction),
            f"{w.staleness_mean:.2f}", str(w.staleness_max), rate(w.samples_per_s))


def _cache_cell(w: WorkerStats) -> str:
    return f"{(w.pull_bytes_saved or 0) / w.iterations / 1e3:,.1f}"


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


TRAINING_NOTE = "training: time from the first iteration, downtime left out"
EVALUATION_COLUMNS = (Col("training", note=TRAINING_NOTE), Col("epoch"), Col("step"),
                      Col("accuracy"), Col("loss"), Col(""))


def evaluations_table(detail: RunDetail) -> FitTable:
    points = detail.evaluations
    shown = shown_evaluations(points)
    notes = []
    if len(shown) < len(points):
        notes.append(f"{len(shown)} of {len(points)} shown, including the best and the last; "
                     "--json lists all")
    best = max(p.accuracy for p in points)
    rows: list[tuple[str, ...]] = []
    styles = []
    for point in shown:
        mark = "best" if point.accuracy == best else ""
        rows.append((fmt_seconds(point.training_s), f"{point.epoch:.2f}", str(point.step),
                     fmt_pct(point.accuracy), fmt_loss(point.loss), mark))
        styles.append("bold green" if mark else "")
    return FitTable(EVALUATION_COLUMNS, rows, title="test evaluations", notes=notes,
                    row_styles=styles)
