"""sparse-synthetic: parsed and written out in full, made the same from its seed, power-law
feature frequencies, rows selected exactly."""

from __future__ import annotations

import numpy as np
import pytest

from engine.datasets import describe, locate
from engine.datasets.sources import check_source, label, load_sparse
from engine.datasets.sparse import SyntheticSpec, canonical, generate, parse
from engine.errors import ConfigError

SMALL = "sparse-synthetic:features=5000,nnz=20,samples=3000,test=500,seed=3"


def test_parse_and_canonical_round_trip() -> None:
    spec = parse(SMALL)
    assert spec == SyntheticSpec(features=5000, nnz=20, samples=3000, test=500, seed=3)
    assert parse(canonical(spec)) == spec
    assert check_source("sparse-synthetic") == canonical(SyntheticSpec())
    assert label(SMALL) == "sparse-synthetic" and locate(SMALL) == "generated"
    info = describe(SMALL)
    assert info.sparse and info.input_dim == 5000 and info.num_classes == 2


@pytest.mark.parametrize(("text", "says"), [
    ("sparse-synthetic:features=1", "features must be"),
    ("sparse-synthetic:nnz=0", "nnz must be"),
    ("sparse-synthetic:size=3", "is not KEY=VALUE with KEY one of features"),
    ("sparse-synthetic:features=many", "features='many' is not a number"),
    ("sparse-synthetic:alpha=5", "alpha must be"),
])
def test_bad_specs_say_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse(text)


def test_the_same_seed_makes_the_same_data_and_frequencies_follow_a_power_law() -> None:
    train, test, truth = generate(parse(SMALL))
    again, _, _ = generate(parse(SMALL))
    np.testing.assert_array_equal(train.indices, again.indices)
    np.testing.assert_array_equal(train.labels, again.labels)
    assert len(train) == 3000 and len(test) == 500 and truth.shape == (5000,)
    lengths = np.diff(train.indptr)
    assert lengths.max() <= 20 and lengths.mean() > 10  # duplicates drawn count once
    counts = np.sort(np.bincount(train.indices, minlength=5000))[::-1]
    assert counts[0] > 50 * max(counts[999], 1)  # a few features in most rows, most in few
    assert 0.3 < train.labels.mean() < 0.7  # both classes present
    for row in range(5):  # column ids sorted and distinct within a row
        ids = train.indices[train.indptr[row]:train.indptr[row + 1]]
        assert (np.diff(ids) > 0).all()


def test_rows_selects_exactly_those_rows() -> None:
    train, _, _ = generate(parse(SMALL))
    chosen = np.array([7, 2, 2999])
    part = train.rows(chosen)
    dense_all = train.matrix(5000).toarray()
    np.testing.assert_array_equal(part.matrix(5000).toarray(), dense_all[chosen])
    np.testing.assert_array_equal(part.labels, train.labels[chosen])


def test_load_sparse_limits_the_training_rows() -> None:
    data = load_sparse(SMALL, train_limit=100)
    assert len(data.train) == 100 and len(data.test) == 500
    with pytest.raises(ConfigError, match="not a sparse data set"):
        load_sparse("mnist")


@pytest.mark.parametrize(("settings", "says"), [
    ({"model": {"name": "mlp"}}, "sparse data sets train model logreg, not mlp"),
    ({"model": {"name": "logreg"}, "comm": {"prune": "topk:1%"}}, "does not take comm.prune"),
    ({"model": {"name": "logreg"}, "cluster": {"backend": "sim"}},
     "does not take cluster.backend sim"),
])
def test_sparse_runs_refuse_what_their_loop_cannot_do(settings: dict[str, object],
                                                      says: str) -> None:
    from engine.plan import parse_config

    with pytest.raises(ConfigError, match=says):
        parse_config({"data": {"dataset": SMALL}, **settings})
    with pytest.raises(ConfigError, match="train.loop sparse trains sparse data sets"):
        parse_config({"train": {"loop": "sparse"}})


def test_sparse_data_defaults_to_logistic_regression_under_bounded_delay() -> None:
    from engine.config import RunConfig
    from engine.plan import parse_config

    config = parse_config({"data": {"dataset": "sparse-synthetic"}})
    assert config.sync.model == "bounded-delay" and config.model.name == "logreg"
    assert config.data.dataset.startswith("sparse-synthetic:features=1000000,nnz=50,")
    chosen = parse_config({"data": {"dataset": SMALL}, "sync": {"model": "bsp"}})
    assert chosen.sync.model == "bsp"  # what the run says wins
    assert RunConfig.model_validate(config.to_json_dict()) == config  # the stored config reads back
