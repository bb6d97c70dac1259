"""The simulated cluster on sparse data sets: the sparse loop's working-set pulls and pushes by
key list, the servers' sparse shards (and the embedding model's dense one beside), and the
evaluator's objective, log loss and AUC, in virtual time."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from engine.config import RunConfig
from engine.plan import build_config
from engine.sim.clock import run_virtual
from engine.sim.cluster import SimCluster
from engine.wire.records import RunStatus
from tests.engine.sim.test_cluster import EPOCH, LoggingSink

LOGREG = "sparse-synthetic:features=5000,nnz=20,samples=4000,test=500,seed=3"
CLICKS = "sparse-synthetic:features=2^30,nnz=20,samples=4000,test=1000,ctr=0.2"


def config(dataset: str, **overrides: Any) -> RunConfig:
    values = {"cluster.backend": "sim", "data.dataset": dataset, "cluster.workers": 2,
              "cluster.servers": 2, "train.epochs": 3,
              "regime.compute_ms": 10.0, "sim.server_ms": 0.5, "regime.network": "1gbit:0.2ms"}
    return build_config({}, values | overrides)


def logreg(**overrides: Any) -> RunConfig:
    # docs/models.md's settings for this workload: proximal SGD, summed pushes, an L1 penalty.
    return config(LOGREG, **{"model.name": "logreg", "sync.model": "bounded-delay",
                             "sync.delay": 2, "optimizer.name": "sgd", "optimizer.momentum": 0.0,
                             "optimizer.lr": 1.0, "sync.push_scale": "sum",
                             "optimizer.l1": 1e-4, "train.batch_size": 100, **overrides})


def simulate(cfg: RunConfig) -> tuple[RunStatus, float, LoggingSink]:
    sink = LoggingSink()
    cluster = SimCluster(cfg, sink, epoch=EPOCH, interrupted=threading.Event())
    status, _, virtual_s = run_virtual(cluster.run())
    return status, virtual_s, sink


def test_sparse_logistic_regression_trains_by_working_sets() -> None:
    status, virtual_s, sink = simulate(logreg())
    assert status is RunStatus.FINISHED
    assert len(sink.rows) == 2 * 3 * 20  # 2,000 samples a worker, batches of 100, 3 epochs
    objectives = [e.loss for e in sink.evaluations]
    assert len(objectives) == 3  # after epochs 1 and 2, and at the end
    assert objectives[-1] < objectives[0] < np.log(2)  # it starts at log 2, all weights 0
    assert sink.evaluations[-1].accuracy > 0.6  # 4,000 samples of 5,000 features: few seen
    # A working set of 100 samples of 20 features is at most 2,000 of the 5,000 keys (fewer
    # pushed past the KKT filter): frames of keys and values, well under a dense model's.
    assert all(r.push_bytes < r.push_bytes_dense / 2 for r in sink.rows)
    assert all(r.bytes_received > 0 for r in sink.rows)
    facts = [e.detail for e in sink.events if e.kind == "sparse_model"]
    assert len(facts) == 3 and facts[-1]["objective"] == objectives[-1]
    assert 0 < facts[-1]["nonzero"] <= 5000
    # Bounded delay's tasks overlap communication with the next computations: 10 ms a batch,
    # 20 batches a worker and epoch, and little else.
    assert virtual_s < 3 * 20 * 0.010 * 1.5
    simulated = next(e.detail for e in sink.events if e.kind == "simulated")
    assert simulated["update_of"] == "push of a batch's working set"
    assert simulated["update_ms"] == pytest.approx(0.5)


def test_the_kkt_filter_pushes_fewer_keys() -> None:
    with_filter = simulate(logreg(**{"optimizer.l1": 1e-2}))[2]
    without = simulate(logreg(**{"optimizer.l1": 1e-2, "comm.kkt_filter": False}))[2]
    sent = [sum(r.push_bytes for r in s.rows) for s in (with_filter, without)]
    assert sent[0] < sent[1]


def test_the_pull_filter_answers_working_sets_key_by_key() -> None:
    """At delta 0 every changed value is sent and the client's copy holds the rest: the losses
    are the unfiltered run's."""
    plain = simulate(logreg(**{"train.epochs": 1}))[2]
    exact = simulate(logreg(**{"train.epochs": 1, "comm.pull_filter": "significant:0"}))[2]
    assert [r.loss for r in exact.rows] == pytest.approx([r.loss for r in plain.rows], rel=1e-6)


@pytest.mark.parametrize("sync", [{"sync.model": "bsp"}, {"sync.model": "asp"}])
def test_other_consistency_models_train_sparse_data_too(sync: dict[str, Any]) -> None:
    status, _, sink = simulate(logreg(**{"train.epochs": 1, **sync}))
    assert status is RunStatus.FINISHED and len(sink.rows) == 2 * 20
    if sync["sync.model"] == "bsp":
        assert all(r.staleness == 0 for r in sink.rows)


def test_the_embedding_model_trains_a_sparse_table_beside_dense_layers() -> None:
    cfg = config(CLICKS, **{"model.name": "embedding", "train.epochs": 1})
    status, _, sink = simulate(cfg)
    assert status is RunStatus.FINISHED
    losses = [e.loss for e in sink.evaluations]
    assert losses[-1] < 0.5  # below the entropy of 20 % clicks
    aucs = [m for m in sink.metrics if m.role == "evaluator" and m.name == "auc"]
    assert len(aucs) == len(losses) and aucs[-1].value > 0.5
    stats = sorted((e.detail for e in sink.events if e.kind == "server_stats"),
                   key=lambda d: d["rank"])
    assert len(stats) == 2


def test_the_same_seed_gives_the_same_sparse_run() -> None:
    cfg = logreg(**{"train.epochs": 1, "heterogeneity.jitter": {
        "distribution": "lognormal", "sigma": 0.3}, "heterogeneity.stragglers": [
        {"rank": 1, "factor": 2.0}]})
    first, second = simulate(cfg)[2], simulate(cfg)[2]
    assert first.rows == second.rows and first.evaluations == second.evaluations
    other = simulate(logreg(**{"train.epochs": 1, "train.seed": 7}))[2]
    assert [r.loss for r in other.rows] != [r.loss for r in first.rows]


def test_options_the_sparse_loop_does_not_take_stay_refused() -> None:
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="does not take comm.prune"):
        logreg(**{"comm.prune": "topk:1%"})
    with pytest.raises(ConfigError, match="does not model comm.compress"):
        logreg(**{"comm.compress": "lz4"})
