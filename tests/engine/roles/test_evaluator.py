"""The evaluator's exit when its servers are gone: quiet if the coordinator said the run is
over (a run stopped while the evaluator was still loading), a failure otherwise; and its test
set over shared read-only memory, without torch's warning in its log."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

from engine.roles.evaluator import _told_to_stop
from engine.transport.control import Lost
from engine.wire.messages import Exit, Stop


class Inbox:
    def __init__(self, *messages: Any) -> None:
        self.inbox: queue.Queue[Any] = queue.Queue()
        for message in messages:
            self.inbox.put(message)


@pytest.mark.parametrize("message", [Stop(reason="time limit of 0.001 s reached"), Exit()])
def test_a_stop_or_exit_means_the_run_is_over(message: Any) -> None:
    assert _told_to_stop(Inbox(message), 1.0) is True  # type: ignore[arg-type]


def test_a_stop_that_arrives_a_little_later_still_counts() -> None:
    inbox = Inbox()

    def later() -> None:
        time.sleep(0.1)
        inbox.inbox.put(Stop(reason="done"))

    threading.Thread(target=later, daemon=True).start()
    assert _told_to_stop(inbox, 2.0) is True  # type: ignore[arg-type]


def test_silence_or_a_lost_coordinator_is_a_real_failure() -> None:
    started = time.monotonic()
    assert _told_to_stop(Inbox(), 0.2) is False  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0  # bounded by the grace period
    assert _told_to_stop(Inbox(Lost("gone")), 0.2) is False  # type: ignore[arg-type]


def test_a_test_set_in_shared_read_only_memory_makes_no_torch_warning() -> None:
    """A role forked from the warm template holds the data set in pages it shares read-only;
    the evaluator only reads them, and its log stays free of torch's UserWarning about it. In a
    fresh process: torch warns once per process, so an earlier test could hide it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import warnings, numpy as np\n"
            "from engine.roles.evaluator import tensors_of_test_set\n"
            "x, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int64)\n"
            "x.flags.writeable = y.flags.writeable = False\n"
            "with warnings.catch_warnings(record=True) as said:\n"
            "    warnings.simplefilter('always')\n"
            "    tx, ty = tensors_of_test_set(x, y)\n"
            "assert tx.shape == (4, 3) and ty.shape == (4,)\n"
            "print(len(said), [str(w.message)[:60] for w in said])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=True)
    assert done.stdout.startswith("0 []"), done.stdout + done.stderr
