"""From stored bucket aggregates to chart values: rates, idle fraction, per-worker and overall.

Each bucket row of :mod:`engine.db.series` becomes one record per worker plus one for all
workers together (worker ``-1``). A record depends only on the rows of its own bucket, so a live
view can replace a bucket's records without recomputing the rest of the chart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from engine.db.series import BUCKET_FIELDS, Buckets

ALL_WORKERS = -1

# Columns of a derived record, in order (sent to the page as arrays to keep messages small).
RECORD_FIELDS = (
    "worker", "b", "n", "t", "it", "throughput", "idle_fraction", "staleness_min",
    "staleness_max", "loss_min", "loss_max", "sent_per_s", "received_per_s",
    "compute", "push", "pull", "wait", "lr_min", "lr_max", "pushed_per_s",
    "pushed_dense_per_s", "pull_saved_per_s",
)

# metric -> (unit, title, record columns: one value, or a min/max pair)
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "throughput": ("samples/s", "Throughput", ("throughput",)),
    "idle_fraction": ("fraction of wall time", "Idle (wait) fraction", ("idle_fraction",)),
    "staleness": ("updates since the pull", "Staleness", ("staleness_min", "staleness_max")),
    "loss": ("cross-entropy", "Training loss", ("loss_min", "loss_max")),
    "bytes_sent": ("bytes/s", "Bytes sent", ("sent_per_s",)),
    "bytes_received": ("bytes/s", "Bytes received", ("received_per_s",)),
    "compute": ("s per bucket", "Compute time", ("compute",)),
    "push": ("s per bucket", "Push time", ("push",)),
    "pull": ("s per bucket", "Pull time", ("pull",)),
    "wait": ("s per bucket", "Wait time", ("wait",)),
    "lr_scale": ("factor on the learning rate", "Applied learning-rate scale",
                 ("lr_min", "lr_max")),
    "push_bytes": ("bytes/s", "Push bytes, sent and before the push filter",
                   ("pushed_per_s", "pushed_dense_per_s")),
    "pull_bytes_saved": ("bytes/s", "Pull bytes the worker's cache saved (SSP, DSSP)",
                         ("pull_saved_per_s",)),
}
EVALUATION_METRICS = {"accuracy": ("fraction", "Test accuracy"), "test_loss": ("cross-entropy",
                                                                             "Test loss")}


def derive(buckets: Buckets) -> list[list[Any]]:
    """Records (``RECORD_FIELDS`` order) for every worker's bucket and for all workers."""
    if not buckets.rows:
        return []
    ix = {name: i for i, name in enumerate(BUCKET_FIELDS)}
    groups: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    records = []
    for row in buckets.rows:
        groups[row[ix["b"]]].append(row)
        records.append(_record(row[ix["worker"]], [row], buckets, ix))
    for b, rows in groups.items():
        records.append(_record(ALL_WORKERS, rows, buckets, ix, bucket=b))
    return records


def _record(worker: int, rows: Sequence[tuple[Any, ...]], buckets: Buckets, ix: dict[str, int],
            bucket: int | None = None) -> list[Any]:
    b = rows[0][ix["b"]] if bucket is None else bucket
    # The newest bucket may still be filling; the page leaves it out of rate charts while live.
    span = buckets.width
    workers = len(rows)

    def total(name: str) -> float:
        return float(sum(r[ix[name]] or 0 for r in rows))

    def extreme(name: str, pick: Any) -> Any:
        values = [r[ix[name]] for r in rows if r[ix[name]] is not None]
        return pick(values) if values else None

    return [
        worker, b, int(total("n")), extreme("t_last", max), extreme("it", max),
        total("samples") / span, min(1.0, total("wait") / (span * workers)),
        extreme("st_min", min), extreme("st_max", max),
        extreme("loss_min", min), extreme("loss_max", max),
        total("sent") / span, total("received") / span,
        total("compute"), total("push"), total("pull"), total("wait"),
        extreme("lr_min", min), extreme("lr_max", max),
        _rate(rows, ix, "pushed", span), _rate(rows, ix, "pushed_dense", span),
        _rate(rows, ix, "pull_saved", span),
    ]


def _rate(rows: Sequence[tuple[Any, ...]], ix: dict[str, int], name: str,
          span: float) -> float | None:
    """A per-second sum of a column that older runs do not have (None then): the push bytes
    came with schema 5, the pull bytes a cache saved with schema 6."""
    values = [r[ix[name]] for r in rows if r[ix[name]] is not None]
    return float(sum(values)) / span if values else None


def metric_series(metric: str, records: list[list[Any]], origin: float) -> dict[str, Any]:
    """One metric's points per worker (and ``all``), for the JSON API."""
    unit, title, columns = METRICS[metric]
    ix = {name: i for i, name in enumerate(RECORD_FIELDS)}
    series: dict[str, dict[str, list[Any]]] = {}
    for rec in sorted(records, key=lambda r: (r[0], r[1])):
        key = "all" if rec[0] == ALL_WORKERS else f"worker {rec[0]}"
        out = series.setdefault(key, {"t": [], "elapsed_s": [], "iteration": [],
                                      **{c: [] for c in columns}})
        out["t"].append(rec[ix["t"]])
        out["elapsed_s"].append(rec[ix["t"]] - origin)
        out["iteration"].append(rec[ix["it"]])
        for column in columns:
            out[column].append(rec[ix[column]])
    return {"metric": metric, "title": title, "unit": unit, "series": series}


def raw_value(metric: str, row: dict[str, Any]) -> float | None:
    """The full-fidelity value of ``metric`` for one iteration row (for downloads)."""
    duration = row["ended_at"] - row["started_at"]

    def per_s(value: float) -> float | None:
        return value / duration if duration > 0 else None

    values: dict[str, Callable[[], float | None]] = {
        "throughput": lambda: per_s(row["samples"]),
        "idle_fraction": lambda: row["wait_s"] / duration if duration > 0 else None,
        "staleness": lambda: row["staleness"],
        "loss": lambda: row["loss"],
        "bytes_sent": lambda: per_s(row["bytes_sent"]),
        "bytes_received": lambda: per_s(row["bytes_received"]),
        "compute": lambda: row["compute_s"],
        "push": lambda: row["push_s"],
        "pull": lambda: row["pull_s"],
        "wait": lambda: row["wait_s"],
        "lr_scale": lambda: row["lr_scale"],
        "push_bytes": lambda: per_s(row["push_bytes"]) if row["push_bytes"] is not None
        else None,
        "pull_bytes_saved": lambda: per_s(row["pull_bytes_saved"])
        if row["pull_bytes_saved"] is not None else None,
    }
    return values[metric]()
