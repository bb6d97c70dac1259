"""The user's own metrics on the wire: what a report may carry, checked where it arrives."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from engine.errors import ProtocolError
from engine.usermetrics import MAX_NAMES
from engine.wire.messages import (
    MAX_REPORTED_METRICS,
    Evaluation,
    Iterations,
    dump_control,
    parse_control,
)
from engine.wire.records import EvaluationRecord, UserMetricRecord


def metric(**overrides: Any) -> dict[str, Any]:
    return {"role": "worker", "rank": 1, "iteration": 7, "at": 1000.5, "name": "grad_norm",
            "value": 0.25, **overrides}


def test_a_report_carries_its_iterations_metrics_there_and_back() -> None:
    rows = [UserMetricRecord(**metric(iteration=i, value=i / 4)) for i in range(3)]
    sent = Iterations(rows=[], metrics=rows)
    got = parse_control(dump_control(sent))
    assert isinstance(got, Iterations) and got.metrics == rows
    evaluation = EvaluationRecord(at=1.0, elapsed_s=1.0, step=5, accuracy=0.5, loss=1.0,
                                  epoch=1.0)
    said = Evaluation(row=evaluation, metrics=[UserMetricRecord(**metric(role="evaluator",
                                                                          rank=0))])
    assert parse_control(dump_control(said)) == said


@pytest.mark.parametrize("bad", [{"name": "grad norm"}, {"name": "x" * 65}, {"name": ""},
                                 {"role": "server"}, {"rank": -1}, {"iteration": -1},
                                 {"extra": 1}])
def test_a_record_that_psctl_log_could_not_have_made_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        UserMetricRecord(**metric(**bad))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_value_that_is_not_finite_is_refused_off_the_wire(value: str) -> None:
    text = dump_control(Iterations(rows=[], metrics=[UserMetricRecord(**metric())]))
    forged = text.replace('"value":0.25', f'"value":"{value}"')
    assert forged != text
    with pytest.raises(ProtocolError):
        parse_control(forged)


def test_a_report_holds_a_bounded_number_of_values() -> None:
    row = UserMetricRecord(**metric())
    Iterations(rows=[], metrics=[row] * MAX_REPORTED_METRICS)
    with pytest.raises(ValidationError):
        Iterations(rows=[], metrics=[row] * (MAX_REPORTED_METRICS + 1))
    evaluation = EvaluationRecord(at=1.0, elapsed_s=1.0, step=5, accuracy=0.5, loss=1.0,
                                  epoch=1.0)
    with pytest.raises(ValidationError):
        Evaluation(row=evaluation, metrics=[row] * (MAX_NAMES + 1))
