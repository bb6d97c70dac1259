"""Workers joining and leaving a running job (engine.roles.membership): which ranks join and
leave, the bounds of a request and the credential psctl scale attaches with, and which jobs may
change their workers at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ConfigError, StoreError
from engine.roles.membership import (
    CONTROL_CREDENTIAL,
    MAX_SERVERS,
    MAX_WORKERS,
    SCALABLE_MODELS,
    Membership,
    check_count,
    check_scalable,
    check_servers_scalable,
    read_control_credential,
    write_control_credential,
)

pytestmark = pytest.mark.timeout(10)


# -- Membership.scale_to ----------------------------------------------------------------------


def test_a_new_job_has_not_scaled() -> None:
    members = Membership(3)
    assert members.active == members.started == {0, 1, 2}
    assert members.joining == members.leaving == set()
    assert members.scaled is False


def test_scaling_up_adds_the_next_ranks_as_joining() -> None:
    members = Membership(2)
    assert members.scale_to(4) == ([2, 3], [])
    assert members.active == members.started == {0, 1, 2, 3}
    assert members.joining == {2, 3}
    assert members.leaving == set()
    assert members.scaled is True


def test_scaling_down_leaves_the_highest_active_rank() -> None:
    members = Membership(4)
    assert members.scale_to(3) == ([], [3])
    assert members.active == {0, 1, 2}
    assert members.started == {0, 1, 2, 3}
    assert members.leaving == {3}
    assert members.joining == set()
    assert members.scaled is True


def test_scaling_down_by_several_leaves_the_highest_ranks_in_order() -> None:
    members = Membership(5)
    assert members.scale_to(2) == ([], [2, 3, 4])
    assert members.active == {0, 1}
    assert members.leaving == {2, 3, 4}


def test_ranks_are_never_reused_after_a_scale_down() -> None:
    members = Membership(4)
    assert members.scale_to(3) == ([], [3])
    assert members.scale_to(4) == ([4], [])  # not 3 again
    assert members.active == {0, 1, 2, 4}
    assert members.scale_to(2) == ([], [2, 4])  # the highest active ranks, 3 is long gone
    assert members.scale_to(5) == ([5, 6, 7], [])
    assert members.active == {0, 1, 5, 6, 7}
    assert members.started == set(range(8))
    assert members.leaving == {2, 3, 4}


def test_down_then_up_from_the_initial_size_allocates_new_ranks() -> None:
    members = Membership(2)
    assert members.scale_to(1) == ([], [1])
    assert members.scale_to(2) == ([2], [])
    assert members.scale_to(3) == ([3], [])
    assert sorted(members.started) == [0, 1, 2, 3]
    assert members.active == {0, 2, 3}


def test_scaling_to_the_current_size_changes_nothing() -> None:
    members = Membership(3)
    assert members.scale_to(3) == ([], [])
    assert members.active == members.started == {0, 1, 2}
    assert members.scaled is False


def test_scaled_stays_true_once_the_workers_changed() -> None:
    up = Membership(2)
    up.scale_to(3)
    up.scale_to(2)  # the same count again, but rank 2 started and left
    assert up.active == {0, 1}
    assert up.scaled is True
    down = Membership(2)
    down.scale_to(1)
    assert down.started == {0, 1} and down.active == {0}
    assert down.scaled is True


# -- check_count and the credential psctl scale attaches with --------------------------------


@pytest.mark.parametrize(("role", "count"), [("workers", 1), ("workers", MAX_WORKERS),
                                             ("servers", 1), ("servers", MAX_SERVERS)])
def test_a_request_within_the_bounds_passes(role: str, count: int) -> None:
    check_count(role, count)


@pytest.mark.parametrize(("role", "count", "says"), [
    ("workers", 0, f"--workers 0: a job has 1 to {MAX_WORKERS} workers"),
    ("workers", MAX_WORKERS + 1, f"a job has 1 to {MAX_WORKERS} workers"),
    ("servers", 0, f"--servers 0: a job has 1 to {MAX_SERVERS} servers"),
    ("servers", MAX_SERVERS + 1, f"a job has 1 to {MAX_SERVERS} servers"),
])
def test_a_request_out_of_range_is_refused_in_words(role: str, count: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_count(role, count)


def test_the_credential_is_readable_by_the_runs_user_alone(tmp_path: Path) -> None:
    write_control_credential(tmp_path, "scale.0.secret")
    path = tmp_path / CONTROL_CREDENTIAL
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_control_credential(tmp_path) == "scale.0.secret"
    assert [p.name for p in tmp_path.iterdir()] == [CONTROL_CREDENTIAL]  # no partial left


def test_a_missing_credential_is_a_store_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"credential for psctl scale .*{CONTROL_CREDENTIAL}"):
        read_control_credential(tmp_path)
    with pytest.raises(StoreError, match="cannot write"):
        write_control_credential(tmp_path / "gone", "x")


# -- check_scalable ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["asp", "ssp", "dssp", "bounded-delay"])
def test_models_that_count_a_changing_set_of_workers_may_scale(model: str) -> None:
    check_scalable(model, "none")
    check_scalable(model, "consgd", 1)
    check_scalable(model, "dynsgd", push_every=1)


def test_the_scalable_models_are_the_four_documented_ones() -> None:
    # read from the consistency registry's capabilities, in registration order
    assert SCALABLE_MODELS == ("asp", "ssp", "bounded-delay", "dssp")


@pytest.mark.parametrize("model", ["bsp", "elastic"])
def test_models_with_a_fixed_set_of_workers_are_refused(model: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_scalable(model, "none")
    message = str(caught.value)
    assert message.startswith(f"a {model} job cannot change its workers: {model} counts a "
                              "fixed set of workers in every round")
    assert message.endswith("psctl scale works with asp, ssp, bounded-delay, dssp")


@pytest.mark.parametrize("rule", ["adaptive", "split"])
def test_rules_with_per_worker_state_are_refused(rule: str) -> None:
    with pytest.raises(ConfigError, match=rf"learning.rule {rule} keeps per-worker state"):
        check_scalable("asp", rule)


@pytest.mark.parametrize("push_every", [2, 10])
def test_pushing_every_few_iterations_is_refused(push_every: int) -> None:
    with pytest.raises(ConfigError, match=r"train.push_every"):
        check_scalable("ssp", "none", push_every)


def test_push_every_one_is_fine() -> None:
    check_scalable("ssp", "none", 1)


def test_the_model_is_checked_before_the_rule_and_push_every() -> None:
    with pytest.raises(ConfigError, match="a bsp job cannot change its workers"):
        check_scalable("bsp", "adaptive", 4)


# -- servers (psctl scale --servers) ----------------------------------------------------------


@pytest.mark.parametrize(("target", "ranges", "replicas", "says"), [
    (1, 4, 1, "1 servers cannot hold the 2 copies"),
    (5, 4, 0, "cut into 4 ranges, so at most 4 servers"),
])
def test_a_server_count_the_ranges_or_copies_cannot_fit_is_refused(
        target: int, ranges: int, replicas: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_servers_scalable(2, target, ranges, replicas)


def test_a_server_count_that_fits_is_taken() -> None:
    check_servers_scalable(2, 4, 4, 1)
    check_servers_scalable(4, 2, 8, 1)
