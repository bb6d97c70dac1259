"""The coordinator's recording part: the user's own metrics keep to MAX_NAMES names a run."""

from __future__ import annotations

from typing import Any

from engine.errors import StoreError
from engine.roles.recording import Records
from engine.usermetrics import MAX_NAMES
from engine.wire.records import UserMetricRecord


class KeepingSink:
    def __init__(self) -> None:
        self.metrics: list[UserMetricRecord] = []
        self.events: list[Any] = []

    def record_user_metrics(self, rows: list[UserMetricRecord]) -> None:
        self.metrics.extend(rows)

    def record_event(self, row: Any) -> None:
        self.events.append(row)


def rows(names: list[str], rank: int = 0) -> list[UserMetricRecord]:
    return [UserMetricRecord(role="worker", rank=rank, iteration=0, at=1.0, name=name, value=1.0)
            for name in names]


def test_names_past_the_runs_bound_are_dropped_and_said_once() -> None:
    sink = KeepingSink()
    failures: list[StoreError] = []
    records = Records(sink, failures.append)  # type: ignore[arg-type]
    first = [f"m{i}" for i in range(MAX_NAMES)]
    records.user_metrics(rows(first))
    # another process's code logs other names: the run has its MAX_NAMES already
    records.user_metrics(rows(["m0", "extra", "other"], rank=1))
    records.user_metrics(rows(["extra"], rank=1))
    assert [r.name for r in sink.metrics] == [*first, "m0"]
    [event] = sink.events
    assert event.kind == "user_metrics_dropped"
    assert event.detail["names"] == ["extra", "other"]
    assert failures == []
