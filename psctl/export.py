"""``psctl export``: every row a run owns, one file per table, with nothing rounded or dropped.

CSV writes floats with ``repr`` (the shortest text that reads back as the same double) and NULL
as an empty field; JSON writes an array of row objects (NULL as ``null``); Parquet keeps the
database's column types and nulls. A ``manifest.json`` lists the tables and their row counts.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, select

from engine.db.schema import (
    SCHEMA_VERSION,
    evaluations,
    events,
    iterations,
    layer_iterations,
    process_samples,
    runs,
    syncs,
    tags,
    user_metrics,
)
from engine.errors import StoreError

FORMATS = ("csv", "json", "parquet")
# Each table with the column that holds the run id, ordered by its key so exports are stable.
TABLES: tuple[tuple[Table, str], ...] = (
    (runs, "id"),
    (iterations, "run_id"),
    (evaluations, "run_id"),
    (events, "run_id"),
    (tags, "run_id"),
    (syncs, "run_id"),
    (process_samples, "run_id"),
    (layer_iterations, "run_id"),
    (user_metrics, "run_id"),  # what the run's own code logged with psctl.log
)
_BATCH = 50_000


def export_run(engine: Engine, run_id: str, fmt: str, out_dir: Path) -> dict[str, int]:
    """Write the run's rows of every table into ``out_dir``; the row count of each table."""
    writers: dict[str, Callable[[Table, Iterator[list[Any]], Path], int]] = {
        "csv": _write_csv,
        "json": _write_json,
        "parquet": _write_parquet,
    }
    if fmt not in writers:
        raise ValueError(f"unknown export format {fmt!r}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {out_dir}: {exc}") from None
    counts: dict[str, int] = {}
    with engine.connect() as conn:  # one read transaction: every table from the same snapshot
        for table, column in TABLES:
            stmt = select(table).where(table.c[column] == run_id).order_by(*export_order(table))
            result = conn.execution_options(stream_results=True).execute(stmt)
            batches = (list(map(tuple, part)) for part in result.partitions(_BATCH))
            path = out_dir / f"{table.name}.{fmt}"
            try:
                counts[table.name] = writers[fmt](table, batches, path)
            except OSError as exc:
                raise StoreError(f"cannot write {path}: {exc}") from None
    manifest = {"run_id": run_id, "schema_version": SCHEMA_VERSION, "format": fmt,
                "tables": counts}
    path = out_dir / "manifest.json"
    try:
        path.write_text(json.dumps(manifest, indent=2) + "\n")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from None
    return counts


def _write_csv(table: Table, batches: Iterator[list[Any]], path: Path) -> int:
    count = 0
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([c.name for c in table.columns])
        for batch in batches:
            writer.writerows([_csv_cell(v) for v in row] for row in batch)
            count += len(batch)
    return count


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)
    return "" if value is None else value


def _write_json(table: Table, batches: Iterator[list[Any]], path: Path) -> int:
    names = [c.name for c in table.columns]
    count = 0
    with path.open("w") as handle:
        handle.write("[")
        for batch in batches:
            for row in batch:
                handle.write(",\n" if count else "\n")
                handle.write(json.dumps(dict(zip(names, row, strict=True))))
                count += 1
        handle.write("\n]\n")
    return count


def _write_parquet(table: Table, batches: Iterator[list[Any]], path: Path) -> int:
    import pyarrow as pa  # heavy: loaded only for a parquet export
    import pyarrow.parquet as pq

    types = {"INTEGER": pa.int64(), "REAL": pa.float64(), "TEXT": pa.string()}
    schema = pa.schema(
        [pa.field(c.name, types[str(c.type)], nullable=bool(c.nullable)) for c in table.columns]
    )
    count = 0
    with pq.ParquetWriter(path, schema) as writer:
        for batch in batches:
            columns = list(zip(*batch, strict=True))
            writer.write_table(pa.Table.from_arrays(
                [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
                schema=schema,
            ))
            count += len(batch)
        if count == 0:
            writer.write_table(schema.empty_table())
    return count


def export_order(table: Table) -> list[Any]:
    """The table's key, or for keyless samples their time and process: a stable export."""
    if len(table.primary_key.columns):
        return list(table.primary_key.columns)
    return [table.c.at, table.c.role, table.c.rank]
