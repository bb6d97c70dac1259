"""Workers joining and leaving a running job (engine.roles.membership): which ranks join and
leave, the scale request and spawn files the coordinator and the launcher share, and which jobs
may change their workers at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.errors import ConfigError, StoreError
from engine.roles.membership import (
    MAX_SERVERS,
    MAX_WORKERS,
    SCALABLE_MODELS,
    SCALE_FILE,
    SPAWN_FILE,
    Membership,
    check_scalable,
    check_servers_scalable,
    ranks_to_spawn,
    request_scale,
    request_servers,
    wanted_servers,
    wanted_workers,
    write_json,
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


# -- request_scale / wanted_workers ------------------------------------------------------------


def test_request_scale_writes_the_count_and_when(tmp_path: Path) -> None:
    request_scale(tmp_path, 5)
    body = json.loads((tmp_path / SCALE_FILE).read_text())
    assert body["workers"] == 5
    assert isinstance(body["requested_at"], float)
    assert wanted_workers(tmp_path) == (5, body["requested_at"])
    assert [p.name for p in tmp_path.iterdir()] == [SCALE_FILE]  # no partial file left


def test_a_later_request_replaces_the_earlier_one(tmp_path: Path) -> None:
    request_scale(tmp_path, 3)
    first = wanted_workers(tmp_path)
    request_scale(tmp_path, 3)
    second = wanted_workers(tmp_path)
    assert first is not None and second is not None
    assert second[0] == 3 and second[1] >= first[1]
    request_scale(tmp_path, 7)
    latest = wanted_workers(tmp_path)
    assert latest is not None and latest[0] == 7


@pytest.mark.parametrize("workers", [1, MAX_WORKERS])
def test_request_scale_takes_the_bounds(tmp_path: Path, workers: int) -> None:
    request_scale(tmp_path, workers)
    wanted = wanted_workers(tmp_path)
    assert wanted is not None and wanted[0] == workers


@pytest.mark.parametrize("workers", [0, -1, MAX_WORKERS + 1])
def test_request_scale_refuses_a_count_out_of_range(tmp_path: Path, workers: int) -> None:
    with pytest.raises(ConfigError, match=rf"--workers {workers}: a job has 1 to {MAX_WORKERS}"):
        request_scale(tmp_path, workers)
    assert not (tmp_path / SCALE_FILE).exists()


def test_write_json_replaces_the_file_atomically(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The new content is written to a partial file first and renamed over the target, so a
    reader sees the old request or the new one, never half of one."""
    target = tmp_path / SCALE_FILE
    target.write_text(json.dumps({"workers": 2, "requested_at": 1.5}))
    seen: list[tuple[str, str, object]] = []
    real_replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        # At the moment of the rename the reader still gets the complete old request.
        seen.append((Path(src).name, Path(dst).name, wanted_workers(tmp_path)))
        assert json.loads(Path(src).read_text())["workers"] == 9
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_json(target, {"workers": 9, "requested_at": 2.5})
    assert seen == [(SCALE_FILE + ".partial", SCALE_FILE, (2, 1.5))]
    assert wanted_workers(tmp_path) == (9, 2.5)
    assert not (tmp_path / (SCALE_FILE + ".partial")).exists()


def test_write_json_into_a_missing_folder_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot write"):
        write_json(tmp_path / "gone" / SCALE_FILE, {"workers": 2})
    with pytest.raises(StoreError):
        request_scale(tmp_path / "gone", 2)


def write_scale(folder: Path, text: str) -> None:
    (folder / SCALE_FILE).write_text(text)


def test_no_request_file_means_no_request(tmp_path: Path) -> None:
    assert wanted_workers(tmp_path) is None


@pytest.mark.parametrize("text", [
    "",
    "{",
    "not json at all",
    '{"workers": 3, "requested_at": 1.0',  # cut off mid-write
    "[3, 1.0]",
    "3",
    "null",
    '"workers"',
])
def test_garbage_requests_are_ignored(tmp_path: Path, text: str) -> None:
    write_scale(tmp_path, text)
    assert wanted_workers(tmp_path) is None


def test_undecodable_bytes_are_ignored(tmp_path: Path) -> None:
    (tmp_path / SCALE_FILE).write_bytes(b"\xff\xfe\x00{")
    assert wanted_workers(tmp_path) is None


@pytest.mark.parametrize("body", [
    {"workers": True, "requested_at": 1.0},
    {"workers": False, "requested_at": 1.0},
    {"workers": 0, "requested_at": 1.0},
    {"workers": -3, "requested_at": 1.0},
    {"workers": MAX_WORKERS + 1, "requested_at": 1.0},
    {"workers": 3.0, "requested_at": 1.0},
    {"workers": "3", "requested_at": 1.0},
    {"workers": None, "requested_at": 1.0},
    {"workers": [3], "requested_at": 1.0},
    {"requested_at": 1.0},
    {"workers": 3},  # no requested_at
    {"workers": 3, "requested_at": None},
    {"workers": 3, "requested_at": "1.0"},
    {"workers": 3, "requested_at": True},
])
def test_invalid_requests_are_ignored(tmp_path: Path, body: dict[str, object]) -> None:
    write_scale(tmp_path, json.dumps(body))
    assert wanted_workers(tmp_path) is None


def test_a_valid_hand_written_request_is_read(tmp_path: Path) -> None:
    write_scale(tmp_path, json.dumps({"workers": 4, "requested_at": 12.25, "extra": "ignored"}))
    assert wanted_workers(tmp_path) == (4, 12.25)


# -- ranks_to_spawn ----------------------------------------------------------------------------


def write_spawn(folder: Path, text: str) -> None:
    (folder / SPAWN_FILE).write_text(text)


def test_no_spawn_file_means_nothing_to_spawn(tmp_path: Path) -> None:
    assert ranks_to_spawn(tmp_path) == []


def test_the_spawn_file_lists_the_ranks(tmp_path: Path) -> None:
    write_json(tmp_path / SPAWN_FILE, {"ranks": [0, 1, 2, 5]})
    assert ranks_to_spawn(tmp_path) == [0, 1, 2, 5]


@pytest.mark.parametrize("text", ["", "{", "[0, 1]", '{"ranks": 3}', '{"ranks": "0,1"}',
                                  '{"ranks": null}', '{"other": [1]}'])
def test_a_garbage_spawn_file_spawns_nothing(tmp_path: Path, text: str) -> None:
    write_spawn(tmp_path, text)
    assert ranks_to_spawn(tmp_path) == []


def test_invalid_ranks_are_dropped(tmp_path: Path) -> None:
    write_spawn(tmp_path, json.dumps({"ranks": [0, -1, 2**20, 2**20 - 1, 3.0, "4", None, [5],
                                                {"r": 6}, 7]}))
    assert ranks_to_spawn(tmp_path) == [0, 2**20 - 1, 7]


def test_boolean_ranks_are_dropped(tmp_path: Path) -> None:
    write_spawn(tmp_path, json.dumps({"ranks": [True, False, 2]}))
    assert ranks_to_spawn(tmp_path) == [2]


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


def test_a_servers_request_has_its_own_file_and_leaves_the_workers_alone(tmp_path: Path) -> None:
    request_scale(tmp_path, 4)
    request_servers(tmp_path, 3)
    wanted = wanted_servers(tmp_path)
    assert wanted is not None and wanted[0] == 3
    workers = wanted_workers(tmp_path)
    assert workers is not None and workers[0] == 4


@pytest.mark.parametrize("servers", [0, MAX_SERVERS + 1])
def test_a_servers_request_out_of_range_is_refused(tmp_path: Path, servers: int) -> None:
    with pytest.raises(ConfigError, match=rf"--servers {servers}: a job has 1 to {MAX_SERVERS}"):
        request_servers(tmp_path, servers)
    assert wanted_servers(tmp_path) is None


def test_the_spawn_file_names_workers_and_servers_apart(tmp_path: Path) -> None:
    write_json(tmp_path / SPAWN_FILE, {"ranks": [0, 1, 2], "servers": [0, 1, 2, 3]})
    assert ranks_to_spawn(tmp_path) == [0, 1, 2]
    assert ranks_to_spawn(tmp_path, "server") == [0, 1, 2, 3]
    write_json(tmp_path / SPAWN_FILE, {"ranks": [0]})
    assert ranks_to_spawn(tmp_path, "server") == []


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
