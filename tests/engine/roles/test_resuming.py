"""A resume that fails before the run trains again leaves the run's earlier end as it was (the
whole path: tests/integration/test_failures_in_words.py)."""

from __future__ import annotations

import pytest

from engine.roles.resuming import EarlierEnd, end_to_record
from engine.wire.records import RunStatus

FAILED, INTERRUPTED = RunStatus.FAILED, RunStatus.INTERRUPTED
EARLIER = EarlierEnd(INTERRUPTED, "interrupted by the user")


def test_a_resume_that_fails_before_training_keeps_the_earlier_end() -> None:
    assert end_to_record(EARLIER, False, FAILED, "server 0 failed: bad checkpoint") == (
        INTERRUPTED, "interrupted by the user")


@pytest.mark.parametrize(("earlier", "trained", "status"), [
    (EARLIER, True, FAILED),  # it trained again: its failure is the run's
    (None, False, FAILED),  # it had crashed: it recorded no end to keep
    (EARLIER, False, INTERRUPTED),  # stopped by the user: that is its end
    (EARLIER, True, RunStatus.FINISHED),
])
def test_any_other_end_is_the_runs_own(earlier: EarlierEnd | None, trained: bool,
                                       status: RunStatus) -> None:
    assert end_to_record(earlier, trained, status, "why") == (status, "why")
