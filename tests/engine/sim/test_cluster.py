"""The simulated cluster's behaviour against what each model must do, on the digits set."""

from __future__ import annotations

import statistics
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.config import RunConfig
from engine.errors import ConfigError
from engine.plan import build_config
from engine.sim.clock import run_virtual
from engine.sim.cluster import SimCluster
from engine.wire.records import IterationRecord, RunStatus, UserMetricRecord
from tests.engine.test_cluster_memory import Sink as MemorySink

EPOCH = 1_000_000.0


class Sink(MemorySink):
    """Every row the simulated cluster records, kept."""

    @property
    def rows(self) -> list[IterationRecord]:
        return self.iterations

    def of(self, worker: int) -> list[IterationRecord]:
        return [r for r in self.iterations if r.worker == worker]


# The default MLP (3 x 512) spends most of a simulated run in the servers' updates: a 64-wide
# one shows every behaviour below at a tenth of the cost. The tests of bytes on the wire keep
# the default, where a frame's headers are small beside its values.
SMALL_MODEL = {"model.hidden": [64]}
DEFAULT_MODEL = {"model.hidden": [512, 512, 512]}


def config(**overrides: Any) -> RunConfig:
    values = {"cluster.backend": "sim", "data.dataset": "digits", "cluster.workers": 4,
              **SMALL_MODEL,
              "cluster.servers": 2, "train.epochs": 1, "regime.compute_ms": 100.0,
              "sim.server_ms": 1.0, "regime.network": "10gbit:50us", "sim.cores": 2}
    return build_config({}, values | overrides)


def simulate(cfg: RunConfig, stop: threading.Event | None = None) -> tuple[RunStatus, float,
                                                                           Sink]:
    sink = Sink()
    cluster = SimCluster(cfg, sink, epoch=EPOCH, interrupted=stop or threading.Event())
    status, _, virtual_s = run_virtual(cluster.run())
    return status, virtual_s, sink


def test_bsp_fast_workers_wait_for_the_straggler() -> None:
    status, virtual_s, sink = simulate(config(**{"heterogeneity.stragglers": [
        {"rank": 0, "factor": 3.0}]}))
    assert status is RunStatus.FINISHED
    assert len(sink.rows) == 4 * 6
    assert all(r.staleness == 0 for r in sink.rows)
    fast = statistics.mean(r.wait_s for r in sink.of(1)[1:])
    assert fast == pytest.approx(0.2, abs=0.01)  # 300 ms of the straggler minus 100 of its own
    assert statistics.mean(r.wait_s for r in sink.of(0)) < 0.005
    assert virtual_s == pytest.approx(6 * 0.3, rel=0.05)
    assert sink.evaluations and sink.evaluations[-1].at <= EPOCH + virtual_s


def test_asp_fast_workers_run_ahead_and_see_stale_models() -> None:
    _, _, sink = simulate(config(**{"sync.model": "asp", "stop.max_seconds": 1.0,
                                    "train.epochs": 20,
                                    "heterogeneity.stragglers": [{"rank": 0, "factor": 3.0}]}))
    assert len(sink.of(1)) >= 2 * len(sink.of(0))
    assert max(r.staleness for r in sink.of(0)) >= 3
    assert all(r.wait_s == 0 for r in sink.rows)


def test_ssp_bounds_how_far_the_fastest_leads() -> None:
    _, _, sink = simulate(config(**{"sync.model": "ssp", "sync.staleness": 1,
                                    "train.epochs": 2,
                                    "heterogeneity.stragglers": [{"rank": 0, "factor": 4.0}]}))
    assert any(r.wait_s > 0 for r in sink.of(1))
    # when the straggler starts clock c, nobody has started past c + s + 1
    starts = {(r.worker, r.iteration): r.started_at for r in sink.rows}
    for (worker, clock), began in starts.items():
        slow = max((c for (w, c), t in starts.items() if w == 0 and t <= began), default=0)
        assert clock <= slow + 2, (worker, clock, slow)


def test_network_bandwidth_shows_in_push_and_pull_time() -> None:
    _, _, slow_net = simulate(config(**{"regime.network": "100mbit:1ms"}, **DEFAULT_MODEL))
    _, _, fast_net = simulate(config(**DEFAULT_MODEL))
    dense = slow_net.rows[0].push_bytes
    # four workers share each server's incoming side: a push takes at least its own bytes' time
    assert statistics.mean(r.push_s for r in slow_net.rows) > dense / 12.5e6
    assert statistics.mean(r.push_s for r in fast_net.rows) < dense / 12.5e6 / 10


# The overlapped and delayed loops push gradients about 8 updates stale here (4 workers in step,
# two iterations in flight): with server momentum 0.9 they diverge, as real runs do; without
# momentum they learn.
@pytest.mark.parametrize("overrides", [
    {"sync.model": "asp", "train.overlap": True, "optimizer.momentum": 0.0},
    {"sync.model": "asp", "train.fetch_every": 2, "train.push_every": 2, "optimizer.name":
     "adagrad"},
    {"sync.model": "bounded-delay", "sync.delay": 2, "optimizer.momentum": 0.0},
    {"train.loop": "layered"},
    {"comm.prune": "topk:1%", "sync.model": "asp"},
    {"sync.model": "dssp"},
    {"sync.model": "elastic", "sync.lookahead": 15},
    {"comm.wire_dtype": "float16"},
])
def test_every_loop_and_policy_trains(overrides: dict[str, Any]) -> None:
    status, _, sink = simulate(config(**{"train.epochs": 4} | overrides))
    assert status is RunStatus.FINISHED
    assert len(sink.rows) == 4 * 24
    # ten classes: chance is 0.1, a diverged run stays near it; 24 iterations is little training
    assert max(e.accuracy for e in sink.evaluations) > 0.4


def test_pruned_pushes_are_sparse() -> None:
    _, _, sink = simulate(config(**{"comm.prune": "topk:1%"}, **DEFAULT_MODEL))
    row = sink.rows[-1]
    assert row.push_bytes < 0.05 * row.push_bytes_dense


def test_elastic_records_its_barriers() -> None:
    _, _, sink = simulate(config(**{"sync.model": "elastic", "train.epochs": 2,
                                    "heterogeneity.stragglers": [{"rank": 0, "factor": 3.0}]}))
    assert sink.syncs


def test_an_interrupt_stops_after_the_current_steps() -> None:
    stop = threading.Event()
    stop.set()
    status, _, sink = simulate(config(), stop)
    assert status is RunStatus.INTERRUPTED  # before any iteration
    assert any(e.kind == "stop" and e.detail["reason"] == "interrupted" for e in sink.events)


def test_target_accuracy_stops_the_run() -> None:
    status, _, sink = simulate(config(**{"train.epochs": 20, "stop.target_accuracy": 0.8,
                                         "eval.interval_s": 0.5}))
    assert status is RunStatus.FINISHED
    assert len(sink.rows) < 4 * 6 * 20
    assert max(e.accuracy for e in sink.evaluations) >= 0.8


@pytest.mark.parametrize(("overrides", "says"), [
    ({"comm.compress": "lz4", "comm.prune": "topk:1%"}, "comm.compress"),
    ({"comm.schedule": "fifo"}, "comm.schedule"),
    ({"regime.network": "fast"}, "BANDWIDTH:LATENCY"),
    ({"sim.compute_ms": 10.0}, "sim.compute_ms: moved to regime.compute_ms"),
    ({"cluster.backend": "slurm"}, "unknown backend 'slurm'"),
])
def test_what_the_simulator_cannot_model_fails_fast(overrides: dict[str, Any], says: str) -> None:
    values = {"cluster.backend": "sim", "regime.compute_ms": 10.0}
    with pytest.raises(ConfigError, match=says):
        build_config({}, values | overrides)


def test_lbfgs_is_refused_on_the_simulated_cluster() -> None:
    with pytest.raises(ConfigError, match="does not take cluster.backend sim"):
        config(**{"optimizer.name": "lbfgs", "cluster.backend": "sim"})


def test_a_diverging_run_fails_at_its_virtual_time_with_its_rows() -> None:
    # lr 1e6 with momentum blows the model up within a few iterations: a push turns infinite
    status, virtual_s, sink = simulate(config(**{"optimizer.lr": 1e6, "train.epochs": 5}))
    assert status is RunStatus.FAILED
    (failed,) = [e for e in sink.events if e.kind == "run_failed"]
    assert "the model diverged: worker" in failed.detail["reason"]
    assert "try a lower learning rate" in failed.detail["reason"]
    assert sink.rows and virtual_s >= max(r.ended_at for r in sink.rows) - EPOCH > 0


def test_a_nan_test_loss_fails_the_run_as_diverged(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.roles.evaluator as evaluator

    monkeypatch.setattr(evaluator, "evaluate", lambda *args, **kwargs: (0.1, float("nan")))
    status, _, sink = simulate(config(**{"eval.interval_s": 0.5}))
    assert status is RunStatus.FAILED
    assert sink.evaluations == []  # the database keeps no NaN loss
    assert any(e.kind == "diverged" for e in sink.events)


@pytest.mark.timeout(60)
def test_a_diverging_delayed_loop_fails_instead_of_waiting_forever() -> None:
    # Pushes left in flight by the bounded-delay loop are never answered once a server has
    # refused a non-finite push: the run must fail, not tick virtual time for ever. Without
    # momentum only the wide default model reaches an infinite push at this rate.
    status, virtual_s, sink = simulate(config(**{
        "sync.model": "bounded-delay", "sync.delay": 2, "optimizer.momentum": 0.0,
        "optimizer.lr": 3.0, "train.epochs": 30, "eval.interval_s": 0.5}, **DEFAULT_MODEL))
    assert status is RunStatus.FAILED and virtual_s < 60
    assert any(e.kind == "run_failed" for e in sink.events)


@pytest.mark.parametrize("loop", ["plain", "layered"])
def test_a_pipelined_pull_saves_the_ack_round_trip_and_changes_no_result(loop: str) -> None:
    """As the real loops: the pull of c + 1 leaves right behind the push of c. On a 20 ms link
    a BSP iteration no longer waits for the push's ack to come back before its pull goes out:
    the pull request travels with the push, so one round trip (40 ms) is saved."""
    slow = {"regime.network": "10gbit:20ms", "train.loop": loop, "cluster.workers": 2}
    status, pipelined_s, pipelined = simulate(config(**slow))
    assert status is RunStatus.FINISHED
    status, waiting_s, waiting = simulate(config(**slow, **{"train.pipeline": False}))
    assert status is RunStatus.FINISHED
    assert [(r.worker, r.iteration, r.loss) for r in pipelined.rows] == \
        [(r.worker, r.iteration, r.loss) for r in waiting.rows]
    iterations = len(pipelined.of(0))
    # every iteration but the last sends its next pull ahead
    assert waiting_s - pipelined_s == pytest.approx((iterations - 1) * 0.040, rel=0.1)


# -- bounded delay (seed 003: OSDI'14's global dependency) and SSP's cache (Ho et al.) ----------


def dependency_violations(rows: list[IterationRecord], delay: int) -> int:
    """Times a worker started computing iteration c before some worker had sent its push of
    c - delay - 1 (OSDI'14's bounded delay forbids it): the start is the push time less the
    compute time, as the acceptance check reads it from the database."""
    pushed = {(r.worker, r.iteration): r.pushed_at for r in rows}
    workers = {r.worker for r in rows}
    return sum(1 for r in rows for w in workers
               if (at := pushed.get((w, r.iteration - delay - 1))) is not None
               and r.pushed_at is not None and at > r.pushed_at - r.compute_s + 1e-9)


STRAGGLER_4X = {"heterogeneity.stragglers": [{"rank": 0, "factor": 4.0}], "cluster.servers": 1,
                "train.epochs": 3}


def test_bounded_delay_keeps_the_global_dependency_and_overlaps() -> None:
    status, _, sink = simulate(config(**STRAGGLER_4X, **{"sync.model": "bounded-delay",
                                                         "sync.delay": 1}))
    assert status is RunStatus.FINISHED
    assert dependency_violations(sink.rows, 1) == 0
    # T = 1 lets an iteration start with the previous one's push in flight somewhere
    assert dependency_violations(sink.rows, 0) > 0


def test_the_dependency_check_finds_violations_under_asp() -> None:
    _, _, sink = simulate(config(**STRAGGLER_4X, **{"sync.model": "asp"}))
    assert dependency_violations(sink.rows, 1) > 0


def test_bounded_delay_zero_is_sequential_and_its_communication_is_not_idle_time() -> None:
    status, virtual_s, sink = simulate(config(**STRAGGLER_4X, **{"sync.model": "bounded-delay",
                                                                 "sync.delay": 0}))
    assert status is RunStatus.FINISHED
    assert dependency_violations(sink.rows, 0) == 0
    # the straggler waits for nobody: its own pushes and pulls are communication, not waiting
    assert sum(r.wait_s for r in sink.of(0)) == 0
    assert sum(r.pull_s for r in sink.of(0)) > 0
    # as sequential as BSP: the straggler sets the pace
    _, bsp_s, _ = simulate(config(**STRAGGLER_4X))
    assert virtual_s == pytest.approx(bsp_s, rel=0.1)


def received_per_iteration(sink: Sink) -> float:
    return statistics.mean(r.bytes_received for r in sink.rows)


def test_ssps_cache_answers_reads_within_the_bound_and_fetches_less() -> None:
    """Ho et al.: a read is answered from the worker's cache while the copy holds every push
    below c - s. With s = 3 and workers in step, about one read in four fetches."""
    _, _, bsp = simulate(config(**{"train.epochs": 3, "cluster.servers": 1}))
    _, _, ssp = simulate(config(**{"train.epochs": 3, "cluster.servers": 1,
                                   "sync.model": "ssp", "sync.staleness": 3}))
    _, _, fetching = simulate(config(**{"train.epochs": 3, "cluster.servers": 1,
                                        "sync.model": "ssp", "sync.staleness": 3,
                                        "sync.cache": False}))
    assert received_per_iteration(ssp) <= 0.6 * received_per_iteration(bsp)
    assert received_per_iteration(fetching) == received_per_iteration(bsp)
    assert sum(r.pull_bytes_saved for r in ssp.rows) > 0
    assert all(r.pull_bytes_saved == 0 for r in fetching.rows)
    # a read from the cache saved what a fetch moves: the model, beside which acks are small
    model_bytes = max(r.bytes_received for r in fetching.rows)
    assert {r.pull_bytes_saved for r in ssp.rows if r.pull_bytes_saved} <= set(
        range(int(0.95 * model_bytes), int(1.05 * model_bytes)))


def test_ssps_cache_keeps_the_bound_with_a_straggler() -> None:
    _, _, sink = simulate(config(**STRAGGLER_4X, **{"sync.model": "ssp", "sync.staleness": 1}))
    assert sum(r.pull_bytes_saved for r in sink.rows) > 0
    assert dependency_violations(sink.rows, 1) == 0


def test_read_my_writes_steps_the_cached_copy_as_the_server_does() -> None:
    """One worker, plain SGD: every read answered from the cache must be the model the server
    holds, so the losses are those of a run that fetches every read."""
    one = {"cluster.workers": 1, "cluster.servers": 1, "train.epochs": 2, "sync.model": "ssp",
           "sync.staleness": 3, "optimizer.momentum": 0.0}
    _, _, cached = simulate(config(**one))
    _, _, fetching = simulate(config(**one, **{"sync.cache": False}))
    assert sum(1 for r in cached.rows if r.pull_bytes_saved) >= len(cached.rows) // 2
    assert [r.loss for r in cached.rows] == pytest.approx([r.loss for r in fetching.rows],
                                                          rel=1e-5)


# -- budgets: every worker trains to the end (issue 41) ------------------------------------------


def test_a_time_budget_keeps_every_worker_training_to_its_end() -> None:
    """The straggler does not train alone at the end: every worker's last iteration ends
    within two of the straggler's iterations of the others', and the model is tested at a
    quarter, half and three quarters of the budget, and at its end."""
    status, virtual_s, sink = simulate(config(**{
        "sync.model": "asp", "heterogeneity.stragglers": [{"rank": 0, "factor": 3.0}],
        "regime.compute_ms": 20.0, "stop.budget": "6s", "cluster.servers": 1,
        "eval.interval_s": 100.0}))
    assert status is RunStatus.FINISHED
    ends = [max(r.ended_at for r in sink.of(w)) for w in range(4)]
    assert max(ends) - min(ends) <= 2 * 0.060
    per_epoch = 6  # digits' 1,437 samples / 4 workers / 64 a batch
    assert len(sink.of(1)) > 10 * per_epoch  # fast workers cycled over their shards
    # asked at the marks; each recorded once the evaluator's pull and test are done
    evaluated = [e.at - EPOCH for e in sink.evaluations]
    assert evaluated[:3] == pytest.approx([1.5, 3.0, 4.5], abs=0.01)
    assert 6.0 <= evaluated[-1] <= 6.1
    assert virtual_s == pytest.approx(6.0, abs=0.1)


def test_a_samples_budget_stops_the_run_once_spent() -> None:
    status, _, sink = simulate(config(**{"sync.model": "asp", "stop.budget": "4000samples",
                                         "cluster.servers": 1, "eval.interval_s": 100.0}))
    assert status is RunStatus.FINISHED
    samples = sum(r.samples for r in sink.rows)
    assert 4000 <= samples < 4000 + 4 * 64  # at most one batch per worker past it
    assert len(sink.evaluations) == 4  # three marks and the end


def test_the_pull_filter_is_simulated_as_the_real_shard_applies_it() -> None:
    """Seed 003's significantly-modified filter: at delta 0 every changed value is sent, so the
    workers compute exactly what unfiltered pulls give them (the copy they keep holds the rest)
    while each answer names its keys; a coarse delta sends fewer bytes."""
    base = {"cluster.workers": 2, "train.epochs": 1}
    dense = simulate(config(**base))[2]
    exact = simulate(config(**base, **{"comm.pull_filter": "significant:0"}))[2]
    coarse = simulate(config(**base, **{"comm.pull_filter": "significant:0.01"}))[2]
    assert [r.loss for r in exact.rows] == pytest.approx([r.loss for r in dense.rows], rel=1e-6)
    received = [statistics.mean(r.bytes_received for r in s.rows) for s in (dense, exact,
                                                                            coarse)]
    assert received[1] > received[0]  # keys ride along with (nearly) every value
    assert received[2] < 0.9 * received[0]


@pytest.mark.parametrize("sync", [
    {"sync.model": "elastic", "sync.lookahead": 15, "sync.predictor": "last"},
    {"sync.model": "ssp", "sync.staleness": 1},
    {"sync.model": "bounded-delay", "sync.delay": 2},
])
def test_a_budget_ends_a_run_whose_workers_wait_at_a_barrier(sync: dict[str, Any]) -> None:
    """When the budget is spent, a fast worker may be held at a barrier the straggler will
    never reach (it stops too): the servers let every pull go, so the run ends instead of
    deadlocking (an ElasticBSP study's runs failed so before)."""
    status, virtual_s, sink = simulate(config(**sync, **{
        "stop.budget": "12s", "heterogeneity.stragglers": [{"rank": 0, "factor": 3.0}],
        "heterogeneity.jitter": {"distribution": "lognormal", "sigma": 0.3},
        "train.seed": 3}))
    assert status is RunStatus.FINISHED
    assert virtual_s == pytest.approx(12.0, abs=1.0)
    # Every worker trained to the end: its last recorded push within its iterations in
    # flight (the loop's T, bounded delay's, at most 2 here) and two more of the straggler's
    # (each about 0.3 s) of the budget's end; a run's last iterations in flight are not
    # recorded when the servers drain, as in a real run.
    ends = [max(r.pushed_at for r in sink.rows if r.worker == w) - EPOCH for w in range(4)]
    assert min(ends) > 12.0 - (2 + 2) * 0.3 - 0.1


class LoggingSink(Sink):
    """Also what the user's code logged (psctl.log)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[UserMetricRecord] = []

    def record_user_metrics(self, rows: list[UserMetricRecord]) -> None:
        self.metrics.extend(rows)


LOGGING_MODEL = '''
import math

from torch import nn

import psctl


class Summing(nn.Module):
    def __init__(self, inputs: int, classes: int) -> None:
        super().__init__()
        self.layer = nn.Linear(inputs, classes)

    def forward(self, x):
        psctl.log("input_sum", x.sum())  # which batch this forward pass saw
        return self.layer(x.flatten(1))


def build(shape, classes):
    return Summing(math.prod(shape), classes)
'''


@pytest.mark.parametrize("overrides", [{}, {"sync.model": "asp", "train.overlap": True,
                                            "heterogeneity.stragglers": [
                                                {"rank": 0, "factor": 2.5}]}])
def test_each_simulated_workers_iteration_gets_what_its_own_batch_logged(
        tmp_path: Path, overrides: dict[str, Any]) -> None:
    from engine.datasets import load_dataset
    from engine.worker.loops import shard_for

    model = tmp_path / "summing.py"
    model.write_text(LOGGING_MODEL)
    cfg = config(**{"model.name": f"{model}:build", "cluster.servers": 1, **overrides})
    sink = LoggingSink()
    status, _, _ = run_virtual(SimCluster(cfg, sink, epoch=EPOCH,
                                          interrupted=threading.Event()).run())
    assert status is RunStatus.FINISHED
    data = load_dataset("digits", None)
    logged = {(m.rank, m.iteration): m for m in sink.metrics if m.role == "worker"}
    assert sorted(logged) == sorted((r.worker, r.iteration) for r in sink.rows)
    for row in sink.rows:
        shard = shard_for(data.train_x, data.train_y, rank=row.worker, workers=4,
                          seed=cfg.train.seed, batch_size=cfg.train.batch_size)
        batch = shard.batches(np.random.default_rng([cfg.train.seed, row.worker, row.epoch]))[
            row.iteration - row.epoch * shard.iterations_per_epoch]
        metric = logged[(row.worker, row.iteration)]
        assert metric.value == pytest.approx(float(shard.inputs[batch].sum()), rel=1e-4)
        assert metric.at == row.ended_at
    steps = sorted({e.step for e in sink.evaluations})
    assert sorted(m.iteration for m in sink.metrics if m.role == "evaluator") == steps
