"""Credentials admit exactly one role and rank; the run's secret admits the operator."""

from __future__ import annotations

import pytest

from engine.transport.admission import OPERATOR, Admission, admit, credential

SECRET = "the-run-secret"


def test_a_credential_admits_its_role_and_rank_only() -> None:
    admission = admit(SECRET, credential(SECRET, "worker", 1))
    assert admission == Admission("worker", 1)
    assert admission.permits("worker", 1)
    assert not admission.permits("worker", 0)
    assert not admission.permits("evaluator", 1)
    assert str(admission) == "worker 1"


def test_the_secret_admits_the_operator_who_may_speak_for_anyone() -> None:
    assert admit(SECRET, SECRET) is OPERATOR
    assert OPERATOR.permits("worker", 0) and OPERATOR.permits("server", 3)
    assert str(OPERATOR) == "the operator"


@pytest.mark.parametrize("offered", [
    "",
    "worker.1",
    credential("another-secret", "worker", 1),
    credential(SECRET, "worker", 1).replace("worker.1.", "worker.0."),  # a rank swapped in
    credential(SECRET, "worker", 1)[:-1] + "A",
    credential(SECRET, "worker", 1) + "x",
    "worker.01." + credential(SECRET, "worker", 1).split(".")[2],  # a rank spelled twice
    "x" * 10_000,
    "\u00e9" * 40,
])
def test_anything_else_admits_nobody(offered: str) -> None:
    assert admit(SECRET, offered) is None


def test_credentials_differ_per_process() -> None:
    made = {credential(SECRET, role, rank)
            for role in ("worker", "evaluator") for rank in range(50)}
    assert len(made) == 100
