"""Rendering of ``psctl zipline replay``: one row per synchronisation, then a summary."""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table
from rich.text import Text


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.1f}"


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def replay_table(replay: dict[str, Any]) -> Table:
    table = Table(title=f"ZipLine replay of run {replay['run_id'][:8]}: R = {replay['lookahead']}, "
                        f"predictor {replay['predictor']}, points: {replay['source']}",
                  title_justify="left")
    for header in ("sync", "base clocks", "chosen r", "predicted wait ms", "actual spread ms",
                   "recorded wait ms", "prediction error ms", "same as live"):
        table.add_column(header, justify="left" if "clocks" in header or header == "chosen r"
                         else "right")
    for sync in replay["syncs"]:
        match = sync["matches_recorded"]
        table.add_row(str(sync["index"]), _clocks(sync["base_clocks"]), _clocks(sync["chosen"]),
                      _ms(sync["predicted_wait"]), _ms(sync["actual_spread"]),
                      _ms(sync["recorded_wait"]), _ms(sync["mean_abs_error"]),
                      "" if match is None else ("yes" if match else "no"))
    return table


def replay_summary(replay: dict[str, Any]) -> Text:
    syncs = replay["syncs"]
    if not syncs:
        return Text("no decision point to replay: the run needs at least two recorded pushes "
                    "per worker (and, for ElasticBSP, one completed prediction)")
    matches = [s["matches_recorded"] for s in syncs if s["matches_recorded"] is not None]
    def mean_ms(key: str) -> str:
        return _ms(_mean([s[key] for s in syncs]))

    parts = [f"{len(syncs)} syncs", f"mean predicted wait {mean_ms('predicted_wait')} ms",
             f"mean actual spread {mean_ms('actual_spread')} ms",
             f"mean prediction error {mean_ms('mean_abs_error')} ms"]
    if matches:
        parts.append(f"{sum(matches)}/{len(matches)} decisions as recorded")
    return Text(", ".join(parts))


def _clocks(values: list[int]) -> str:
    text = " ".join(str(v) for v in values[:8])
    return text + (f" … ({len(values)})" if len(values) > 8 else "")
