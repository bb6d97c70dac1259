"""Key ranges, the range partitioner and splitting a request over shards."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import ConfigError
from engine.keys import KeyRange, RangePartitioner, split_by_shard

# -- KeyRange -----------------------------------------------------------------------------------


def test_key_range_length_and_emptiness() -> None:
    assert len(KeyRange(3, 10)) == 7
    assert len(KeyRange(4, 4)) == 0


@pytest.mark.parametrize(("start", "end"), [(-1, 3), (5, 4), (-3, -1)])
def test_invalid_key_ranges_are_refused(start: int, end: int) -> None:
    with pytest.raises(ConfigError, match=rf"^invalid key range \[{start}, {end}\)$"):
        KeyRange(start, end)


def test_key_ranges_are_frozen_values() -> None:
    assert KeyRange(1, 2) == KeyRange(1, 2)
    assert hash(KeyRange(1, 2)) == hash(KeyRange(1, 2))
    with pytest.raises(AttributeError):
        KeyRange(1, 2).start = 0  # type: ignore[misc]


def test_contains() -> None:
    outer = KeyRange(10, 20)
    assert outer.contains(KeyRange(10, 20))
    assert outer.contains(KeyRange(12, 15))
    assert outer.contains(KeyRange(20, 20))
    assert not outer.contains(KeyRange(9, 15))
    assert not outer.contains(KeyRange(15, 21))


def test_intersect() -> None:
    a = KeyRange(10, 20)
    assert a.intersect(KeyRange(15, 30)) == KeyRange(15, 20)
    assert a.intersect(KeyRange(0, 11)) == KeyRange(10, 11)
    assert a.intersect(KeyRange(12, 13)) == KeyRange(12, 13)
    assert a.intersect(KeyRange(20, 30)) is None  # adjacent: half-open ranges do not overlap
    assert a.intersect(KeyRange(0, 10)) is None
    assert a.intersect(KeyRange(15, 15)) is None


def test_local_slice() -> None:
    shard = KeyRange(100, 110)
    assert shard.local(KeyRange(103, 107)) == slice(3, 7)
    assert shard.local(shard) == slice(0, 10)
    values = list(range(100, 110))
    assert values[shard.local(KeyRange(105, 108))] == [105, 106, 107]


# -- RangePartitioner ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_ranges_cover_every_key_once_with_sizes_differing_by_at_most_one(
    data: st.DataObject,
) -> None:
    num_keys = data.draw(st.integers(1, 10**7), label="num_keys")
    num_shards = data.draw(st.integers(1, min(num_keys, 64)), label="num_shards")
    ranges = RangePartitioner().ranges(num_keys, num_shards)
    assert len(ranges) == num_shards
    assert ranges[0].start == 0
    assert ranges[-1].end == num_keys
    for before, after in itertools.pairwise(ranges):
        assert before.end == after.start  # contiguous: no gap, no overlap
    sizes = [len(r) for r in ranges]
    assert sum(sizes) == num_keys
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1
    assert sizes == sorted(sizes, reverse=True)  # the first shards get the extra keys


def test_ranges_of_a_small_example() -> None:
    assert RangePartitioner().ranges(10, 3) == [KeyRange(0, 4), KeyRange(4, 7), KeyRange(7, 10)]
    assert RangePartitioner().ranges(5, 5) == [KeyRange(i, i + 1) for i in range(5)]
    assert RangePartitioner().ranges(7, 1) == [KeyRange(0, 7)]


@pytest.mark.parametrize("shards", [0, -1])
def test_zero_shards_is_refused(shards: int) -> None:
    with pytest.raises(ConfigError, match="^need at least one shard server$"):
        RangePartitioner().ranges(10, shards)


def test_more_shards_than_keys_is_refused() -> None:
    with pytest.raises(ConfigError, match="^cannot split 3 keys over 4 servers$"):
        RangePartitioner().ranges(3, 4)


# -- split_by_shard -----------------------------------------------------------------------------

SHARDS = [KeyRange(0, 4), KeyRange(4, 7), KeyRange(7, 10)]


def test_split_spanning_all_shards() -> None:
    assert split_by_shard(KeyRange(0, 10), SHARDS) == [
        (0, KeyRange(0, 4)),
        (1, KeyRange(4, 7)),
        (2, KeyRange(7, 10)),
    ]


def test_split_of_a_middle_piece() -> None:
    assert split_by_shard(KeyRange(3, 8), SHARDS) == [
        (0, KeyRange(3, 4)),
        (1, KeyRange(4, 7)),
        (2, KeyRange(7, 8)),
    ]


def test_split_within_one_shard() -> None:
    assert split_by_shard(KeyRange(5, 6), SHARDS) == [(1, KeyRange(5, 6))]


def test_split_of_an_empty_request_is_empty() -> None:
    assert split_by_shard(KeyRange(5, 5), SHARDS) == []


def test_split_beyond_the_key_space_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^key range \[8, 12\) is not covered by shards$"):
        split_by_shard(KeyRange(8, 12), SHARDS)


def test_split_over_a_gap_is_refused() -> None:
    with pytest.raises(ConfigError, match="not covered by shards"):
        split_by_shard(KeyRange(0, 10), [KeyRange(0, 4), KeyRange(5, 10)])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_split_pieces_tile_the_request(data: st.DataObject) -> None:
    num_keys = data.draw(st.integers(1, 5000))
    shards = RangePartitioner().ranges(num_keys, data.draw(st.integers(1, min(num_keys, 16))))
    start = data.draw(st.integers(0, num_keys))
    request = KeyRange(start, data.draw(st.integers(start, num_keys)))
    pieces = split_by_shard(request, shards)
    indices = [index for index, _ in pieces]
    assert indices == sorted(set(indices))
    position = request.start
    for index, piece in pieces:
        assert shards[index].contains(piece)
        assert piece.start == position and len(piece) > 0
        position = piece.end
    assert position == request.end


def test_a_shard_is_sparse_when_its_segments_are_and_may_not_mix_kinds() -> None:
    from engine.errors import ConfigError
    from engine.keys import KeyLayout, KeyRange, Segment

    layout = KeyLayout((Segment("emb", (100,), KeyRange(0, 100), sparse=True),
                        Segment("dense", (10,), KeyRange(100, 110))))
    assert layout.sparse_on(KeyRange(0, 100))
    assert not layout.sparse_on(KeyRange(100, 110))
    with pytest.raises(ConfigError, match="both sparse and dense keys"):
        layout.sparse_on(KeyRange(50, 110))


def test_a_layout_of_both_kinds_never_puts_them_on_one_shard() -> None:
    from engine.errors import ConfigError
    from engine.keys import KeyLayout, KeyRange, Segment, partition

    table = Segment("emb", (1000, 8), KeyRange(0, 8000), sparse=True)
    dense = Segment("fc", (10,), KeyRange(8000, 8010))
    layout = KeyLayout((table, dense))
    assert partition(layout, 4) == [KeyRange(0, 2667), KeyRange(2667, 5334),
                                    KeyRange(5334, 8000), KeyRange(8000, 8010)]
    assert partition(layout, 2) == [KeyRange(0, 8000), KeyRange(8000, 8010)]
    with pytest.raises(ConfigError, match="needs at least 2 key ranges"):
        partition(layout, 1)
    one_kind = KeyLayout((Segment("w", (100,), KeyRange(0, 100), sparse=True),))
    assert partition(one_kind, 3) == [KeyRange(0, 34), KeyRange(34, 67), KeyRange(67, 100)]
