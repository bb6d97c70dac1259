"""Every consistency model, run for real with a straggler, obeys its invariant in the database.

Each check reads only what the recorder wrote. A worker's compute for clock c starts at
``started_at + pull_s + wait_s`` (the loop was blocked until then); a push leaves at ``pushed_at``
and is acknowledged at ``acked_at``. The same checks run on an ASP run, where they must find
violations: that shows they can fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine.consistency.elastic import RECORDED_AHEAD
from engine.launcher import Launcher
from tests.conftest import psctl
from tests.integration.support import config, query

WORKERS = 3
TOLERANCE_S = 2e-3  # time.time() and perf_counter() are mixed in a row's timestamps
STRAGGLER = ({"rank": 2, "factor": 25.0},)
SIDE_BY_SIDE = 4
MODELS: dict[str, dict[str, Any]] = {
    "bsp": {},
    "asp": {},
    "ssp": {"sync__staleness": 1},
    "dssp": {"sync__staleness": 1, "sync__range": 2},
    "bounded-delay": {"sync__delay": 1},
    "elastic": {"sync__lookahead": 6, "sync__predictor": "last"},
    # n x R = 4,200 >= OFFLOAD_FROM: every decision runs on a thread beside the servers' loops
    "elastic-offloaded": {"sync__model": "elastic", "sync__lookahead": 1400,
                          "sync__max_ahead": 1400, "sync__predictor": "last"},
    # every layer pushed as its own frame, last layer first, each committing its own clock
    "bsp-layered": {"sync__model": "bsp", "train__loop": "layered"},
    "ssp-layered": {"sync__model": "ssp", "sync__staleness": 1, "train__loop": "layered"},
    # the same frames, each pushed from inside backward (the straggler holds its own)
    "bsp-wait-free": {"sync__model": "bsp", "train__loop": "wait-free"},
    "ssp-wait-free": {"sync__model": "ssp", "sync__staleness": 1, "train__loop": "wait-free"},
}


def _run(db: Path, model: str, extra: dict[str, Any]) -> str:
    settings = {"sync__model": model, **extra}
    launcher = Launcher(config(data__dataset="digits", cluster__workers=WORKERS,
                               cluster__servers=2, train__epochs=2,
                               heterogeneity__stragglers=STRAGGLER, **settings), db=db)
    launcher.start()
    result = launcher.wait()
    assert result.status.value == "finished", (model, result.reason)
    return launcher.run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The runs side by side, a few at a time: each spends most of its time waiting for its
    sleeping straggler, and what is checked is order in the records, which load cannot undo."""
    db = tmp_path_factory.mktemp("sync") / "experiments.db"
    with ThreadPoolExecutor(max_workers=SIDE_BY_SIDE) as pool:
        futures = {model: pool.submit(_run, db, model, extra) for model, extra in MODELS.items()}
        ids = {model: future.result() for model, future in futures.items()}
    yield db, ids


def rows(db: Path, run_id: str) -> dict[tuple[int, int], dict[str, float]]:
    names = ("worker", "iteration", "started_at", "pull_s", "wait_s", "pushed_at", "acked_at",
             "staleness")
    found = query(db, f"SELECT {', '.join(names)} FROM iterations WHERE run_id = ?", run_id)
    table = {(r[0], r[1]): dict(zip(names, r, strict=True)) for r in found}
    assert len(table) == WORKERS * max(r[1] + 1 for r in found)
    return table


def compute_start(row: dict[str, float]) -> float:
    return row["started_at"] + row["pull_s"] + row["wait_s"]


def lead_violations(table: dict[tuple[int, int], dict[str, float]], bound: int) -> int:
    """Times a worker started computing clock c before another had pushed c - bound - 1."""
    return sum(1 for (worker, clock), row in table.items() if clock > bound
               for other in range(WORKERS)
               if table[(other, clock - bound - 1)]["pushed_at"] > compute_start(row) + TOLERANCE_S)


def delay_violations(table: dict[tuple[int, int], dict[str, float]], delay: int) -> int:
    """Times a worker computed clock c before its own clock c - delay - 1 was acknowledged."""
    return sum(1 for (worker, clock), row in table.items() if clock > delay
               if table[(worker, clock - delay - 1)]["acked_at"] > compute_start(row) + TOLERANCE_S)


def test_bsp_has_staleness_zero_and_runs_in_lockstep(runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    table = rows(db, ids["bsp"])
    assert {row["staleness"] for row in table.values()} == {0}
    assert lead_violations(table, 0) == 0


def test_ssp_never_lets_the_fastest_lead_by_more_than_s(runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    assert lead_violations(rows(db, ids["ssp"]), 1) == 0


def test_dssp_stays_within_s_plus_r(runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    assert lead_violations(rows(db, ids["dssp"]), 1 + 2) == 0


def test_the_lead_check_finds_violations_in_an_asp_run(runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    table = rows(db, ids["asp"])
    assert lead_violations(table, 1) > 0  # the straggler falls far behind
    assert max(row["staleness"] for row in table.values()) > 0


def test_bounded_delay_holds_globally_and_really_overlaps(
        runs: tuple[Path, dict[str, str]]) -> None:
    """OSDI'14 (seed 003): nobody computes c before every worker's pushes before c - T are in."""
    db, ids = runs
    table = rows(db, ids["bounded-delay"])
    assert lead_violations(table, 1) == 0
    assert delay_violations(table, 1) == 0
    assert delay_violations(table, 0) > 0  # some iterations ran with the previous one in flight


def test_ssps_cache_answered_reads_within_the_bound(runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    [(saved,)] = query(db, "SELECT sum(pull_bytes_saved) FROM iterations WHERE run_id = ?",
                       ids["ssp"])
    assert saved > 0  # and test_ssp_never_lets_the_fastest_lead_by_more_than_s holds


@pytest.mark.parametrize("model", ["elastic", "elastic-offloaded"])
def test_elastic_barriers_hold_and_match_the_recorded_arrivals(
        runs: tuple[Path, dict[str, str]], model: str) -> None:
    db, ids = runs
    table = rows(db, ids[model])
    syncs = query(db, "SELECT sync_index, predictor, barrier_clocks, arrivals, released_at, "
                      "actual_wait, predicted, chosen FROM syncs WHERE run_id = ? "
                      "ORDER BY sync_index", ids[model])
    completed = [s for s in syncs if s[4] is not None]
    assert syncs[0][1] == "monitoring" and len(completed) >= 2
    last = max(clock for _, clock in table)
    for index, _, barrier_json, arrivals_json, released, actual_wait, _, chosen in completed:
        barrier, arrivals = json.loads(barrier_json), json.loads(arrivals_json)
        taking_part = [a for a, r in zip(arrivals, json.loads(chosen), strict=True) if r >= 0]
        for worker, barrier_clock in enumerate(barrier):
            clock = min(barrier_clock, last)  # a worker out of data arrives with its last push
            assert arrivals[worker] == pytest.approx(table[(worker, clock)]["pushed_at"], abs=1e-6)
            after = table.get((worker, clock + 1))
            if after is not None:
                assert compute_start(after) >= released - TOLERANCE_S, (index, worker)
        assert actual_wait == pytest.approx(max(taking_part) - min(taking_part))
        assert released == max(taking_part)
    predicted, chosen = json.loads(completed[1][6]), json.loads(completed[1][7])
    assert len(predicted) == WORKERS  # each worker's times up to its chosen iteration
    assert [len(row) for row in predicted] == [min(r + 1, RECORDED_AHEAD) for r in chosen]


def test_replay_recomputes_every_live_decision(runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    done = psctl("zipline", "replay", ids["elastic"], "--json", db=db)
    assert done.returncode == 0, done.stderr
    replay = json.loads(done.stdout)
    assert replay["source"] == "recorded barriers" and replay["syncs"]
    assert all(s["matches_recorded"] for s in replay["syncs"])
    other = json.loads(psctl("zipline", "replay", ids["elastic"], "--json", "--lookahead", "40",
                             db=db).stdout)
    assert other["lookahead"] == 40 and len(other["syncs"]) == len(replay["syncs"])


@pytest.mark.parametrize("model", list(MODELS))
def test_runs_show_reports_idle_time_and_staleness_per_worker(
        runs: tuple[Path, dict[str, str]], model: str) -> None:
    db, ids = runs
    detail = json.loads(psctl("runs", "show", ids[model], "--json", db=db).stdout)
    workers = detail["workers"]
    assert [w["worker"] for w in workers] == list(range(WORKERS))
    for worker in workers:
        assert worker["wait_s_total"] >= 0 and worker["staleness_max"] >= 0
    text = psctl("runs", "show", ids[model], db=db).stdout
    assert "wait" in text and "stale" in text
    if model.startswith("elastic"):  # R = 1,400 puts the offloaded run's barriers far apart
        assert detail["syncs"]["barriers"] >= (3 if model == "elastic" else 1)
        assert "ElasticBSP:" in text
    else:
        assert detail["syncs"] is None


def server_stats(db: Path, run_id: str) -> list[dict[str, Any]]:
    found = query(db, "SELECT detail FROM events WHERE run_id = ? AND kind = 'server_stats'",
                  run_id)
    return sorted((json.loads(row[0]) for row in found), key=lambda s: s["rank"])


@pytest.mark.parametrize("loop", ["layered", "wait-free"])
def test_layered_bsp_has_staleness_zero_and_every_layer_in_lockstep(
        runs: tuple[Path, dict[str, str]], loop: str) -> None:
    db, ids = runs
    table = rows(db, ids[f"bsp-{loop}"])
    assert {row["staleness"] for row in table.values()} == {0}
    assert lead_violations(table, 0) == 0
    clocks = max(clock for _, clock in table) + 1
    stats = server_stats(db, ids[f"bsp-{loop}"])
    assert len(stats) == 2
    for shard in stats:
        # one completed BSP round per clock on every clock range (layer piece) of the shard
        assert shard["range_versions"] == [clocks] * len(shard["range_versions"])
        assert shard["pushes"] == WORKERS * clocks * len(shard["range_versions"])
        assert shard["duplicates"] == 0 and shard["bad_frames"] == 0
    assert sum(len(s["range_versions"]) for s in stats) >= 6 + 1  # 6 layers, one cut in two


@pytest.mark.parametrize("loop", ["layered", "wait-free"])
def test_layered_ssp_lead_never_exceeds_the_bound(runs: tuple[Path, dict[str, str]],
                                                  loop: str) -> None:
    db, ids = runs
    table = rows(db, ids[f"ssp-{loop}"])
    assert lead_violations(table, 1) == 0
    for shard in server_stats(db, ids[f"ssp-{loop}"]):
        assert len(shard["range_versions"]) > 1 and shard["duplicates"] == 0


def test_runs_show_reports_how_far_ahead_the_barriers_were(
        runs: tuple[Path, dict[str, str]]) -> None:
    db, ids = runs
    chosen = [json.loads(c) for (c,) in query(
        db, "SELECT chosen FROM syncs WHERE run_id = ? AND predictor != 'monitoring' "
            "AND released_at IS NOT NULL", ids["elastic"])]
    distances = [max(r + 1 for r in row if r >= 0) for row in chosen]
    detail = json.loads(psctl("runs", "show", ids["elastic"], "--json", db=db).stdout)
    syncs = detail["syncs"]
    assert syncs["barriers"] == len(distances)
    assert syncs["distance_max"] == max(distances) <= 6  # R = 6
    assert syncs["distance_mean"] == pytest.approx(sum(distances) / len(distances))
    shown = psctl("runs", "show", ids["elastic"], db=db).stdout
    assert f"max {max(distances)}" in shown and "barrier distance" in shown
