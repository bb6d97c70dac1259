"""Where every key range's copies live (engine.replication.ring.chains) and the coordinator's map
of them (engine.roles.placement.Placement): what each server holds, who forwards to whom, and
what changes when a server dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from engine.errors import ConfigError
from engine.keys import KeyRange
from engine.replication.ring import chains, held_by
from engine.roles.placement import Order, Placement
from engine.wire.messages import Chain, Promote, ShardInfo

pytestmark = pytest.mark.timeout(20)
REPO = Path(__file__).resolve().parents[3]


# -- chains ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("servers", "replicas"),
                         [(1, 0), (2, 1), (3, 2), (4, 1), (4, 2), (8, 2), (8, 7), (16, 3)])
def test_each_chain_is_its_primary_then_distinct_backups(servers: int, replicas: int) -> None:
    result = chains(servers, replicas)
    assert len(result) == servers
    for index, chain in enumerate(result):
        assert chain[0] == index  # range i's primary is server i
        assert len(chain) == replicas + 1
        assert len(set(chain)) == len(chain)
        assert all(0 <= s < servers for s in chain)


def test_without_replicas_every_chain_is_its_primary_alone() -> None:
    assert chains(5, 0) == [(0,), (1,), (2,), (3,), (4,)]


def test_every_server_backs_up_ranges_when_all_others_are_needed() -> None:
    for index, chain in enumerate(chains(5, 4)):
        assert sorted(chain) == [0, 1, 2, 3, 4] and chain[0] == index


def test_chains_are_deterministic() -> None:
    assert chains(8, 2) == chains(8, 2)
    assert chains(8, 2, vnodes=16) == chains(8, 2, vnodes=16)


def test_chains_are_the_same_in_another_process_with_another_hash_seed() -> None:
    """Every process (coordinator, servers) must agree: the ring hashes with blake2b, not with
    Python's per-process salted hash."""
    code = ("import json; from engine.replication.ring import chains; "
            "print(json.dumps([chains(8, 2), chains(5, 1)]))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=15, check=True)
    theirs = json.loads(done.stdout)
    assert theirs == [[list(c) for c in chains(8, 2)], [list(c) for c in chains(5, 1)]]


def test_backups_are_spread_about_evenly_for_8_servers_and_2_replicas() -> None:
    """16 backup copies over 8 servers: each server holds K = 2 on average; the bound checked
    is that every server holds between K - 1 and K + 1 of them (none holds none, none holds
    more than 3), and no server backs up its own range."""
    servers, replicas = 8, 2
    result = chains(servers, replicas)
    held = Counter(s for chain in result for s in chain[1:])
    assert sum(held.values()) == servers * replicas
    for server in range(servers):
        assert replicas - 1 <= held[server] <= replicas + 1, dict(held)
        assert server not in result[server][1:]


@pytest.mark.parametrize(("servers", "replicas"), [(2, 1), (8, 2), (16, 3), (32, 1), (32, 2),
                                                  (64, 2)])
def test_with_one_range_each_every_server_holds_exactly_k_backups(servers: int,
                                                                   replicas: int) -> None:
    """OSDI'14's placement: each position's successors on the ring; one position per server,
    so the successor relation is a cycle through all of them (64 positions each, as before
    issue 40, gave 0 to 4 backups per server at 32 servers and K = 1)."""
    held = Counter(s for chain in chains(servers, replicas) for s in chain[1:])
    assert sorted(held[s] for s in range(servers)) == [replicas] * servers


@pytest.mark.parametrize(("servers", "replicas", "each"), [(4, 1, 2), (5, 1, 3), (8, 1, 4),
                                                           (32, 1, 4), (8, 2, 3), (8, 3, 2)])
def test_with_more_ranges_each_server_holds_about_k_backups_per_range_it_serves(
        servers: int, replicas: int, each: int) -> None:
    """Within K of K per range served (measured: within 1 for K = 1; 64 positions each, as
    before issue 40, gave 2 to 6 at 8 servers, 4 ranges each, K = 1)."""
    result = chains(servers, replicas, ranges=servers * each)
    held = Counter(s for chain in result for s in chain[1:])
    for server in range(servers):
        assert abs(held[server] - replicas * each) <= replicas, dict(held)
    for index, chain in enumerate(result):
        assert chain[0] == index % servers and len(set(chain)) == replicas + 1


def test_too_few_positions_for_the_ranges_a_server_serves_is_refused() -> None:
    with pytest.raises(ConfigError, match="2 positions per server cannot place 3 ranges each"):
        chains(4, 1, vnodes=2, ranges=12)


def test_the_backups_of_one_servers_ranges_are_not_all_on_one_neighbour() -> None:
    """The ring spreads: over 8 servers the first backups are not all one server's successor
    in rank order (as a plain ring of ranks would place them)."""
    result = chains(8, 2)
    assert any(chain[1] != (chain[0] + 1) % 8 for chain in result)
    assert len({chain[1] for chain in result}) > 1


@pytest.mark.parametrize(("servers", "replicas"), [(1, 1), (3, 3), (3, 4), (2, 2), (4, -1)])
def test_too_many_replicas_for_the_servers_is_a_config_error(servers: int,
                                                             replicas: int) -> None:
    with pytest.raises(ConfigError, match=f"{replicas} replicas need at least"):
        chains(servers, replicas)


def test_held_by_lists_every_range_a_server_holds_a_copy_of() -> None:
    result = chains(4, 2)
    for server in range(4):
        held = held_by(server, result)
        assert server in held
        assert sorted(held) == [i for i, chain in enumerate(result) if server in chain]


def test_held_by_lists_a_servers_own_range_first() -> None:
    result = chains(4, 2)
    for server in range(4):
        assert held_by(server, result)[0] == server


# -- Placement ------------------------------------------------------------------------------------

RANGES = [KeyRange(0, 10), KeyRange(10, 25), KeyRange(25, 40), KeyRange(40, 41)]


def address(index: int, server: int) -> str:
    return f"mem://server-{server}/range-{index}"


def backed_up(placement: Placement, server: int) -> list[int]:
    return [i for i, chain in enumerate(placement.chains) if server in chain[1:]]


def held_copies(placement: Placement, server: int) -> dict[int, str]:
    return {i: address(i, server) for i, chain in enumerate(placement.chains) if server in chain}


def serving(placement: Placement, servers: int | None = None) -> Placement:
    """Every server reports its listeners, as its Serving message does."""
    for server in range(servers or len(placement.ranges)):
        placement.serving(server, held_copies(placement, server))
    return placement


def test_placement_chains_follow_the_ring() -> None:
    placement = Placement(RANGES, replicas=2)
    assert placement.chains == chains(4, 2)
    assert placement.copies == 12
    assert placement.lost == set()


def test_held_lists_the_range_a_server_serves_then_those_it_backs_up_with_their_keys() -> None:
    placement = Placement(RANGES, replicas=2)
    for server in range(4):
        held = placement.held(server)
        assert [info.index for info in held] == [server, *backed_up(placement, server)]
        assert len(held) == 3
        assert placement.primaries(server) == [server]
        for info in held:
            assert (info.start, info.end) == (RANGES[info.index].start, RANGES[info.index].end)
            assert info.address == ""


def test_without_replicas_a_server_holds_its_own_range_alone() -> None:
    placement = Placement(RANGES, replicas=0)
    assert [[i.index for i in placement.held(server)] for server in range(4)] == [
        [0], [1], [2], [3]]
    assert placement.copies == 4


def test_all_serving_once_every_copy_listens() -> None:
    placement = Placement(RANGES, replicas=1)
    assert not placement.all_serving()
    for server in range(4):
        assert not placement.all_serving()
        placement.serving(server, held_copies(placement, server))
    assert placement.all_serving()
    assert len(placement.addresses) == placement.copies == 8
    assert placement.addresses[(2, 2)] == address(2, 2)


def test_links_name_each_copys_successor_and_none_for_the_tail() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    orders = placement.links()
    assert len(orders) == placement.copies
    expected = []
    for index, chain in enumerate(placement.chains):
        for position, server in enumerate(chain):
            successor = (address(index, chain[position + 1]) if position + 1 < len(chain)
                         else None)
            expected.append(Order(server, Chain(index=index, successor=successor)))
    assert orders == expected
    tails = [o for o in orders if isinstance(o.message, Chain) and o.message.successor is None]
    assert [(o.server, o.message.index) for o in tails] == [  # type: ignore[attr-defined]
        (chain[-1], i) for i, chain in enumerate(placement.chains)]


def test_without_replicas_every_copy_is_a_tail() -> None:
    placement = serving(Placement(RANGES, replicas=0))
    assert placement.links() == [Order(i, Chain(index=i, successor=None)) for i in range(4)]
    assert placement.backups() == {}


def test_shard_map_names_each_ranges_primary() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    assert placement.shard_map() == [
        ShardInfo(index=i, address=address(i, i), start=keys.start, end=keys.end)
        for i, keys in enumerate(RANGES)]


def test_backups_are_listed_in_chain_order() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    assert placement.backups() == {
        i: [address(i, s) for s in chain[1:]] for i, chain in enumerate(placement.chains)}
    assert all(len(b) == 2 for b in placement.backups().values())


# -- Placement.lose -------------------------------------------------------------------------------


def test_losing_a_primary_promotes_the_next_copy() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    before = placement.chains[1]
    orders, failed_over, gone = placement.lose(1)
    assert placement.lost == {1}
    assert failed_over == [1]
    assert gone == []
    assert Order(before[1], Promote(index=1)) in orders
    assert placement.chains[1] == before[1:]
    assert placement.shard_map()[1].address == address(1, before[1])
    assert placement.backups()[1] == [address(1, before[2])]


def test_losing_a_middle_copy_relinks_its_predecessor_to_its_successor() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    index, chain = next((i, c) for i, c in enumerate(placement.chains))
    middle = chain[1]
    orders, failed_over, gone = placement.lose(middle)
    assert Order(chain[0], Chain(index=index, successor=address(index, chain[2]))) in orders
    assert index not in failed_over and gone == []
    assert placement.chains[index] == (chain[0], chain[2])


def test_losing_the_tail_makes_its_predecessor_the_tail() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    index, chain = 0, placement.chains[0]
    tail = chain[2]
    orders, failed_over, _ = placement.lose(tail)
    assert Order(chain[1], Chain(index=index, successor=None)) in orders
    assert index not in failed_over
    assert placement.chains[index] == chain[:2]


def test_one_loss_repairs_every_chain_the_server_was_in() -> None:
    """Losing a server yields exactly one order per chain it was in, of the kind its position
    there calls for, and leaves the other chains alone."""
    placement = serving(Placement(RANGES, replicas=2))
    before = list(placement.chains)
    lost = 0
    orders, failed_over, gone = placement.lose(lost)
    expected: list[Order] = []
    for index, chain in enumerate(before):
        if lost not in chain:
            assert placement.chains[index] == chain
            continue
        position = chain.index(lost)
        rest = tuple(s for s in chain if s != lost)
        assert placement.chains[index] == rest
        if position == 0:
            expected.append(Order(rest[0], Promote(index=index)))
        else:
            successor = address(index, rest[position]) if position < len(rest) else None
            expected.append(Order(rest[position - 1], Chain(index=index, successor=successor)))
    assert orders == expected
    assert failed_over == [0]
    assert gone == []
    assert placement.copies == 12 - sum(lost in chain for chain in before)


def test_losing_every_copy_of_a_range_reports_it_gone() -> None:
    placement = serving(Placement(RANGES[:2], replicas=1))
    orders, failed_over, gone = placement.lose(0)
    assert failed_over == [0] and gone == []
    assert sorted(orders, key=lambda o: o.message.index) == [  # type: ignore[attr-defined]
        Order(1, Promote(index=0)), Order(1, Chain(index=1, successor=None))]
    orders, failed_over, gone = placement.lose(1)
    assert orders == [] and failed_over == []
    assert gone == [0, 1]
    assert placement.chains == [(), ()]
    assert placement.lost == {0, 1}
    assert placement.copies == 0


def test_without_replicas_a_lost_server_takes_its_range_with_it() -> None:
    placement = serving(Placement(RANGES, replicas=0))
    assert placement.lose(2) == ([], [], [2])
    assert placement.chains[2] == ()


def test_a_promoted_copy_forwards_to_the_rest_of_its_chain() -> None:
    """After a primary is lost, links() starts the chain at the promoted copy."""
    placement = serving(Placement(RANGES, replicas=2))
    chain = placement.chains[3]
    placement.lose(3)
    links = [o for o in placement.links() if o.message.index == 3]  # type: ignore[attr-defined]
    assert links == [Order(chain[1], Chain(index=3, successor=address(3, chain[2]))),
                     Order(chain[2], Chain(index=3, successor=None))]


def test_losing_a_server_in_no_chain_changes_nothing() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    before = list(placement.chains)
    assert placement.lose(9) == ([], [], [])
    assert placement.chains == before
    assert placement.lost == {9}


# -- more key ranges than servers -----------------------------------------------------------------


@pytest.mark.parametrize(("servers", "ranges", "replicas"), [(2, 4, 0), (2, 8, 1), (3, 7, 2)])
def test_ranges_are_dealt_round_robin_with_distinct_backups(servers: int, ranges: int,
                                                            replicas: int) -> None:
    result = chains(servers, replicas, ranges=ranges)
    assert len(result) == ranges
    for index, chain in enumerate(result):
        assert chain[0] == index % servers
        assert len(chain) == len(set(chain)) == replicas + 1
    assert chains(servers, replicas) == result[:servers]  # one per server: as before


@pytest.mark.parametrize(("servers", "ranges"), [(2, 1), (2, 129), (4, 3)])
def test_a_range_count_outside_one_to_64_per_server_is_refused(servers: int,
                                                               ranges: int) -> None:
    with pytest.raises(ConfigError, match="key ranges over"):
        chains(servers, 0, ranges=ranges)


def test_a_server_holds_every_range_it_serves_first() -> None:
    eight = [KeyRange(i * 10, i * 10 + 10) for i in range(8)]
    placement = Placement(eight, replicas=1, servers=2)
    assert placement.primaries(0) == [0, 2, 4, 6]
    assert [i.index for i in placement.held(0)][:4] == [0, 2, 4, 6]
    assert sorted(i.index for i in placement.held(0)) == list(range(8))  # 2 servers, K = 1
    assert placement.load([0, 1]) == {0: (4, 8), 1: (4, 8)}


# -- a server that comes back, joins, leaves ------------------------------------------------------


def test_a_server_that_comes_back_rejoins_the_chains_it_held_after_their_tails() -> None:
    placement = serving(Placement(RANGES[:2], replicas=1))
    placement.lose(0)
    assert placement.rejoining(0) == [0, 1]
    assert [i.index for i in placement.held(0)] == [0, 1]  # as at the start
    assert placement.begin_join(0, 0) == 1  # the tail that hands over
    assert placement.joining == {0: 0}
    placement.serving(0, {0: "mem://again/0"})
    placement.join(0, 0)
    assert placement.chains[0] == (1, 0) and placement.joining == {}
    assert placement.rejoining(0) == [1]
    assert placement.copies_of()[0] == [address(0, 1), "mem://again/0"]
    assert placement.lost == set()


def test_a_lost_server_listens_nowhere_and_is_adopted_again() -> None:
    placement = serving(Placement(RANGES[:2], replicas=1))
    placement.lose(0)
    assert not any(server == 0 for _, server in placement.addresses)


def test_losing_a_joining_server_lets_the_tail_acknowledge_on_its_own_again() -> None:
    placement = serving(Placement(RANGES[:2], replicas=1))
    placement.lose(0)
    placement.begin_join(1, 0)
    orders, failed_over, gone = placement.lose(0)
    assert (failed_over, gone) == ([], [])
    assert orders == [Order(1, Chain(index=1, successor=None))]
    assert placement.joining == {}


def test_reorder_puts_the_new_primary_first_and_relinks_every_copy() -> None:
    placement = serving(Placement(RANGES, replicas=2))
    chain = placement.chains[1]
    orders = placement.reorder(1, chain[2])
    assert placement.chains[1] == (chain[2], chain[0], chain[1])
    assert orders == [Order(chain[1], Chain(index=1, successor=None)),  # the tail first
                      Order(chain[0], Chain(index=1, successor=address(1, chain[1]))),
                      Order(chain[2], Chain(index=1, successor=address(1, chain[0]))),
                      Order(chain[2], Promote(index=1))]
    assert 1 in placement.primaries(chain[2]) and 1 not in placement.primaries(chain[0])


def test_reorder_to_a_server_without_a_copy_is_refused() -> None:
    placement = serving(Placement(RANGES, replicas=1))
    outsider = next(s for s in range(4) if s not in placement.chains[0])
    with pytest.raises(ValueError, match="holds no copy"):
        placement.reorder(0, outsider)


@pytest.mark.parametrize("position", [1, 2])
def test_dropping_a_copy_links_its_predecessor_past_it(position: int) -> None:
    placement = serving(Placement(RANGES, replicas=2))
    chain = placement.chains[2]
    orders = placement.drop(2, chain[position])
    assert placement.chains[2] == tuple(s for s in chain if s != chain[position])
    successor = address(2, chain[2]) if position == 1 else None
    assert orders == [Order(chain[position - 1], Chain(index=2, successor=successor))]
    assert (2, chain[position]) not in placement.addresses


def test_dropping_a_primary_is_refused_it_must_move_first() -> None:
    placement = serving(Placement(RANGES, replicas=1))
    with pytest.raises(ValueError, match="move it first"):
        placement.drop(0, placement.chains[0][0])


def test_a_server_holds_the_only_copy_of_a_range_once_its_other_copies_are_lost() -> None:
    ranges = [KeyRange(0, 10), KeyRange(10, 20), KeyRange(20, 30)]
    placement = Placement(ranges, replicas=1, servers=3)
    assert all(placement.only_copies(s) == [] for s in range(3))
    placement.lose(0)
    alone = {s: placement.only_copies(s) for s in (1, 2)}
    # every range server 0 held a copy of now lives on one server only
    held_by_0 = [i for i, chain in enumerate(placement.first) if 0 in chain]
    assert sorted(i for ranges_ in alone.values() for i in ranges_) == sorted(held_by_0)
    for server, only in alone.items():
        assert all(placement.chains[i] == (server,) for i in only)
