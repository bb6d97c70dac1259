"""The significantly-modified pull filter: exactly the keys that moved by more than DELTA since
the worker last got them, measured from what it was sent, with a whole answer every N pulls."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.server.pull_filter import (
    PullFilterSpec,
    SendAll,
    SignificantlyModified,
    make_pull_filter,
    parse_pull_filter,
)


def test_only_values_that_moved_past_delta_since_they_were_sent_are_chosen() -> None:
    rule = SignificantlyModified(delta=0.5, refresh_every=10, workers=2, size=6)
    values = np.zeros(6, dtype=np.float32)
    assert rule.select(0, slice(0, 6), values) is None  # the first pull: whole
    values[:] = [0.4, 0.6, -0.7, 0.0, 0.5, 0.2]
    assert rule.select(0, slice(0, 6), values).tolist() == [1, 2]  # 0.5 is not past 0.5
    values[[0, 5]] += 0.2  # key 0 is now 0.6 from what worker 0 holds (0.0), key 5 0.4
    assert rule.select(0, slice(0, 6), values).tolist() == [0]
    # Worker 1 has had nothing yet: its first pull is whole, whatever worker 0 got.
    assert rule.select(1, slice(0, 6), values) is None
    assert rule.select(1, slice(0, 6), values).tolist() == []


def test_a_whole_answer_every_n_pulls_and_for_keys_never_sent() -> None:
    rule = SignificantlyModified(delta=1.0, refresh_every=3, workers=1, size=4)
    values = np.zeros(4, dtype=np.float32)
    answers = []
    for _ in range(7):
        values += 0.1
        answers.append(rule.select(0, slice(0, 4), values))
    assert [a is None for a in answers] == [True, False, False, True, False, False, True]
    # A span never sent to this worker is answered whole, even between refreshes.
    other = SignificantlyModified(delta=1.0, refresh_every=100, workers=1, size=8)
    assert other.select(0, slice(0, 4), np.zeros(4, np.float32)) is None
    assert other.select(0, slice(4, 8), np.zeros(4, np.float32)) is None
    chosen = other.select(0, slice(4, 8), np.array([0, 2, 0, 0], np.float32))
    assert chosen is not None and chosen.tolist() == [5]  # shard-local keys


def test_a_pull_from_outside_the_workers_gets_everything() -> None:
    rule = SignificantlyModified(delta=0.0, refresh_every=100, workers=2, size=2)
    assert rule.select(7, slice(0, 2), np.ones(2, np.float32)) is None
    assert SendAll().select(0, slice(0, 2), np.ones(2, np.float32)) is None


@pytest.mark.parametrize(("text", "spec"), [
    ("none", PullFilterSpec("none")), ("significant:0.001", PullFilterSpec("significant", 1e-3)),
    ("significant:0", PullFilterSpec("significant", 0.0)), (" significant:2e-4 ",
                                                            PullFilterSpec("significant", 2e-4)),
])
def test_forms_that_parse(text: str, spec: PullFilterSpec) -> None:
    assert parse_pull_filter(text) == spec


@pytest.mark.parametrize("text", ["", "significant", "significant:-1", "significant:nan",
                                  "significant:inf", "significant:x", "none:1", "delta:1"])
def test_forms_that_do_not_say_what_to_write(text: str) -> None:
    with pytest.raises(ConfigError, match=r"write none or significant:DELTA"):
        parse_pull_filter(text)


def test_the_registry_builds_each_filter() -> None:
    assert isinstance(make_pull_filter("none", 10, 2, 4), SendAll)
    built = make_pull_filter("significant:0.25", 10, 2, 4)
    assert isinstance(built, SignificantlyModified) and built.delta == 0.25


def test_a_worker_pulling_layer_by_layer_has_every_layer_refreshed_every_n_of_its_pulls() -> None:
    # 8 layers of 2 keys pulled in turn, N = 4: each layer is answered whole on its 1st, 5th,
    # 9th ... pull. Counted per worker (as before), the whole answers fell on whichever layer
    # came 4th, 8th, ...: layers 0 and 4 only, after their first pulls.
    layers = [slice(2 * i, 2 * i + 2) for i in range(8)]
    rule = SignificantlyModified(delta=1.0, refresh_every=4, workers=1, size=16)
    values = np.zeros(16, dtype=np.float32)
    whole: dict[int, list[int]] = {i: [] for i in range(8)}
    for turn in range(12):
        for index, span in enumerate(layers):
            if rule.select(0, span, values[span]) is None:
                whole[index].append(turn)
    assert whole == {i: [0, 4, 8] for i in range(8)}


def test_a_whole_model_pull_after_layer_pulls_is_whole_when_any_key_is_due() -> None:
    rule = SignificantlyModified(delta=1.0, refresh_every=3, workers=1, size=4)
    values = np.zeros(4, dtype=np.float32)
    assert rule.select(0, slice(0, 2), values[:2]) is None  # keys 0-1 sent; 2-3 never
    assert rule.select(0, slice(0, 2), values[:2]) is not None
    assert rule.select(0, slice(0, 4), values) is None  # keys 2-3 are due
    assert rule.select(0, slice(0, 4), values) is not None


def test_a_key_list_pull_is_filtered_key_by_key() -> None:
    rule = SignificantlyModified(delta=0.5, refresh_every=3, workers=1, size=100)
    rows = np.array([2, 40, 7], dtype=np.int64)
    values = np.zeros(3, dtype=np.float32)
    assert rule.select_rows(0, rows, values).tolist() == [0, 1, 2]  # never sent: all due
    values[:] = [0.6, 0.1, 0.0]
    assert rule.select_rows(0, rows, values).tolist() == [0]  # moved past 0.5
    # Row 9 joins the list: due on its own, while the others stay filtered (a range pull would
    # have been answered whole for one due key; a working set nearly always holds one).
    more, more_values = np.array([2, 9, 40, 7]), np.array([0.6, 0.0, 0.1, 0.0], np.float32)
    assert rule.select_rows(0, more, more_values).tolist() == [1]
    # Rows 2, 40 and 7 were due on the 1st pull: whole again on their 4th.
    assert rule.select_rows(0, rows, values).tolist() == [0, 1, 2]


def test_keys_a_shard_does_not_store_are_always_sent_and_nothing_tracks_them() -> None:
    rule = SignificantlyModified(delta=1.0, refresh_every=100, workers=1, size=8)
    rows = np.array([-1, 3, -1], dtype=np.int64)
    for _ in range(3):
        chosen = rule.select_rows(0, rows, np.zeros(3, np.float32))
        assert chosen is not None and chosen[[0, -1]].tolist() == [0, 2]


def test_a_forgotten_worker_is_sent_everything_again() -> None:
    rule = SignificantlyModified(delta=1.0, refresh_every=100, workers=2, size=4)
    rows, values = np.arange(4), np.zeros(4, np.float32)
    rule.select_rows(0, rows, values)
    rule.select(1, slice(0, 4), values)
    assert rule.select_rows(0, rows, values).tolist() == []
    rule.forget(0)
    assert rule.select_rows(0, rows, values).tolist() == [0, 1, 2, 3]
    assert rule.select(1, slice(0, 4), values) is not None  # worker 1 is still held to its copy
    assert rule.select_rows(5, rows, values) is None  # a tool's pull: everything


def test_a_sparse_shards_state_grows_with_the_rows_pulled_not_its_capacity() -> None:
    rule = SignificantlyModified(delta=0.0, refresh_every=100, workers=1, size=1 << 28)
    rule.select_rows(0, np.array([0, 5]), np.zeros(2, np.float32))
    state = rule._sent[0]
    assert len(state.values) < 64
    rule.select_rows(0, np.array([100_000]), np.zeros(1, np.float32))
    assert 100_000 < len(state.values) <= 200_002


def test_a_replaced_state_forgets_every_worker() -> None:
    rule = SignificantlyModified(delta=1.0, refresh_every=100, workers=2, size=4)
    rows, values = np.arange(4), np.zeros(4, np.float32)
    for worker in (0, 1):
        rule.select_rows(worker, rows, values)
    rule.forget_all()
    assert [rule.select_rows(w, rows, values).tolist() for w in (0, 1)] == [[0, 1, 2, 3]] * 2
