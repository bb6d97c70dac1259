"""psctl.log: what it accepts and refuses, where its values go inside and outside a run, and how
a worker's loop gets each iteration's values (sealed, taken, held by simulated workers)."""

from __future__ import annotations

import math
import sys
import threading
import traceback

import numpy as np
import pytest

import psctl
from engine import usermetrics
from engine.errors import MetricError, PsctlError
from engine.usermetrics import Collector, collecting, cut_to_caller


@pytest.mark.parametrize("name", ["grad_norm", "_x", "layer1/act_mean", "lr.0", "a-b",
                                  "x" * 64])
def test_names_that_are_short_identifiers_are_taken(name: str) -> None:
    assert usermetrics.is_name(name)
    psctl.log(name, 1.0)


@pytest.mark.parametrize("name", ["", "grad norm", "1st", "/x", "x" * 65, "naïve", "a,b",
                                  "x\n", None, 3])
def test_other_names_are_refused_saying_what_a_name_is(name: object) -> None:
    assert not usermetrics.is_name(name)
    with pytest.raises(MetricError, match="a metric name is a letter or _") as caught:
        psctl.log(name, 1.0)  # type: ignore[arg-type]
    # where the call was made: this file, not psctl's
    assert f"at {__file__.rsplit('/', 1)[-1]} line" in str(caught.value)


def test_numbers_of_every_kind_become_floats() -> None:
    import torch

    with collecting() as collector:
        for value in (2, 2.0, np.float32(2.0), np.int64(2), np.array([2.0]), torch.tensor(2.0),
                      torch.tensor([2.0], requires_grad=True).sum(), True + 1):
            psctl.log("v", value)
        assert collector.take_open() == {"v": 2.0}


@pytest.mark.parametrize("value", ["1.5", b"1", [1.0], None, object(), np.array([1.0, 2.0]),
                                   float("nan"), float("inf"), -math.inf, 10**400])
def test_anything_but_one_finite_number_is_refused(value: object) -> None:
    import torch

    for bad in (value, torch.tensor([1.0, 2.0])):
        with pytest.raises(MetricError, match=r"psctl.log\('v', .*\) at test_usermetrics.py"):
            psctl.log("v", bad)


def test_a_refusal_is_a_psctl_error_and_a_value_error() -> None:
    with pytest.raises(MetricError) as caught:
        psctl.log("v", "nope")
    assert isinstance(caught.value, PsctlError) and isinstance(caught.value, ValueError)


def test_outside_a_run_values_are_checked_and_kept_nowhere() -> None:
    assert usermetrics.collector() is None
    psctl.log("grad_norm", 3.0)
    with collecting() as collector:
        assert collector.take_open() == {}  # nothing from before came along
    usermetrics.seal(0, 0)
    assert usermetrics.take(0, 0) == {} and usermetrics.take_open() == {}
    usermetrics.hold(0)


def test_collecting_ends_with_its_block_even_on_an_error() -> None:
    with pytest.raises(RuntimeError), collecting():
        assert usermetrics.collector() is not None
        raise RuntimeError("boom")
    assert usermetrics.collector() is None


def test_roles_that_collect_at_once_share_one_collector_until_the_last_ends() -> None:
    # In-process test clusters run each role as a thread: their blocks overlap, not nest.
    first, second = collecting(), collecting()
    shared = first.__enter__()
    assert second.__enter__() is shared
    first.__exit__(None, None, None)
    assert usermetrics.collector() is shared
    second.__exit__(None, None, None)
    assert usermetrics.collector() is None


def test_values_of_a_name_logged_several_times_are_averaged() -> None:
    with collecting() as collector:
        for value in (1.0, 2.0, 6.0):
            psctl.log("loss_part", value)
        psctl.log("other", -4.0)
        assert collector.take_open() == {"loss_part": 3.0, "other": -4.0}
        assert collector.take_open() == {}


def test_a_run_logs_at_most_max_names_names() -> None:
    collector = Collector(max_names=3)
    for name in ("a", "b", "c"):
        collector.add(name, 1.0)
    collector.add("a", 2.0)  # a name already logged is always taken
    with pytest.raises(MetricError, match="at most 3 metric names per run.*a, b, c"):
        collector.add("d", 1.0)
    assert collector.names == ["a", "b", "c"]
    assert usermetrics.MAX_NAMES == 32


def test_a_sealed_iteration_keeps_its_values_when_the_next_one_logs_first() -> None:
    # The overlapped loop: gradient c, row c sealed; gradient c + 1 logs; then row c recorded.
    collector = Collector()
    collector.add("g", 1.0)
    collector.seal(0, 7)
    collector.add("g", 5.0)
    assert collector.take(0, 7) == {"g": 1.0}
    collector.seal(0, 8)
    assert collector.take(0, 8) == {"g": 5.0}


def test_an_iteration_that_logged_nothing_takes_nothing_of_the_next() -> None:
    collector = Collector()
    collector.seal(0, 0)  # nothing logged yet: still sealed, as empty
    collector.add("g", 5.0)  # iteration 1's gradient
    assert collector.take(0, 0) == {}
    collector.seal(0, 1)
    assert collector.take(0, 1) == {"g": 5.0}


def test_a_row_that_was_never_sealed_takes_everything_since_the_last_take() -> None:
    # Sandblaster builds its rows itself: its values are all those of its task's chunks.
    collector = Collector()
    collector.add("g", 1.0)
    collector.add("g", 3.0)
    assert collector.take(2, 40) == {"g": 2.0}
    assert collector.take(2, 41) == {}


def test_rows_never_recorded_leave_at_most_max_sealed_behind() -> None:
    collector = Collector(max_sealed=4)
    for iteration in range(10):
        collector.add("g", float(iteration))
        collector.seal(0, iteration)
    assert collector.take(0, 9) == {"g": 9.0}
    assert collector.take(0, 6) == {"g": 6.0}
    assert collector.take(0, 5) == {}  # dropped, oldest first


def test_simulated_workers_hold_their_values_before_another_computes() -> None:
    collector = Collector()
    collector.add("g", 1.0)
    collector.hold(0)  # worker 0 computed
    collector.add("g", 3.0)
    collector.hold(1)  # worker 1 computed while worker 0 waited in virtual time
    collector.seal(1, 0)
    collector.seal(0, 0)
    assert (collector.take(0, 0), collector.take(1, 0)) == ({"g": 1.0}, {"g": 3.0})


def test_values_from_other_threads_are_all_counted() -> None:
    # Gradient hooks may run on autograd's own threads.
    collector = Collector()

    def log_many() -> None:
        for _ in range(2000):
            collector.add("g", 1.0)

    threads = [threading.Thread(target=log_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    collector.add("g", -8000.0)  # the mean is 0 only if every one of the 8,000 was counted
    assert collector.take_open() == {"g": 0.0}


def _user_code() -> None:
    psctl.log("bad name", 1.0)


def test_a_refused_call_can_be_reported_as_the_users_code_crashing() -> None:
    try:
        _user_code()
    except MetricError:
        tb = cut_to_caller(sys.exc_info()[2])
    frames = traceback.extract_tb(tb)
    assert frames[-1].name == "_user_code" and frames[-1].filename == __file__
