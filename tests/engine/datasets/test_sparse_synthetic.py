"""sparse-synthetic: parsed and written out in full, made the same from its seed, power-law
feature frequencies, rows selected exactly; hashed ids over 10^9 and 2^40 features, drawn by the
Zipf sampler without anything of the feature space's size."""

from __future__ import annotations

import hashlib
import time
import tracemalloc

import numpy as np
import pytest
from scipy.stats import chi2

from engine.datasets import describe, locate
from engine.datasets.sources import check_source, label, load_sparse
from engine.datasets.sparse import (
    SparseSplit,
    SyntheticSpec,
    canonical,
    generate,
    parse,
    zipf_ranks,
)
from engine.errors import ConfigError
from engine.hashing import mix64, unit_normal, unit_uniform

SMALL = "sparse-synthetic:features=5000,nnz=20,samples=3000,test=500,seed=3"


def test_parse_and_canonical_round_trip() -> None:
    spec = parse(SMALL)
    assert spec == SyntheticSpec(features=5000, nnz=20, samples=3000, test=500, seed=3)
    assert parse(canonical(spec)) == spec
    assert spec.ids == "permuted" and canonical(spec).endswith(",seed=3,ids=permuted,ctr=0.0")
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
    ("sparse-synthetic:features=2^63", "features must be 2..2\\^62"),
    ("sparse-synthetic:features=2^x", "features='2\\^x' is not a number"),
    ("sparse-synthetic:features=2^65", "features='2\\^65' is not a number"),
    ("sparse-synthetic:ids=random", "ids must be one of auto, permuted, hashed, got 'random'"),
    ("sparse-synthetic:features=2^31,ids=permuted", "ids=permuted holds tables of every"),
])
def test_bad_specs_say_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse(text)


def test_the_same_seed_makes_the_same_data_and_frequencies_follow_a_power_law() -> None:
    train, test, truth = generate(parse(SMALL))
    again, _, _ = generate(parse(SMALL))
    np.testing.assert_array_equal(train.indices, again.indices)
    np.testing.assert_array_equal(train.labels, again.labels)
    assert len(train) == 3000 and len(test) == 500 and truth(np.arange(5000)).shape == (5000,)
    assert train.indices.dtype == np.int32
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
    ({"model": {"name": "mlp"}}, "sparse data sets train model logreg or embedding, not mlp"),
    ({"model": {"name": "logreg"}, "comm": {"prune": "topk:1%"}}, "does not take comm.prune"),
    ({"model": {"name": "logreg"}, "train": {"overlap": True}, "sync": {"model": "asp"}},
     "does not take train.overlap"),
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


# What the permuted method made before hashed ids came (on 125c5e1): sha256 over both splits'
# arrays and dtypes, and the true weights of every feature. ids=auto keeps these specs permuted.
PERMUTED_DIGESTS = {
    SMALL: "606abc938b466ef87a6c12bccae5c04f083482fef053445885a5415621de190c",
    "sparse-synthetic:features=200000,nnz=30,samples=2000,test=300,alpha=0.7,density=0.3,"
    "noise=0.5,seed=11": "71cebdb4df20518d98dc99336deca9efde50bc4d298c1c55676b08573ca19701",
    "sparse-synthetic:features=2000,nnz=10,samples=400,test=100,seed=1,ids=permuted":
    "a023f826e9ab6e2a1570f27b430bd407ec388afcea3e5df5ad00608dc9ee80e4",
}


def digest(splits: tuple[SparseSplit, SparseSplit], weights: np.ndarray) -> str:
    h = hashlib.sha256()
    for split in splits:
        for array in (split.indptr, split.indices, split.values, split.labels):
            h.update(np.ascontiguousarray(array).tobytes())
            h.update(str(array.dtype).encode())
    h.update(weights.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("text", PERMUTED_DIGESTS)
def test_permuted_ids_make_the_same_data_as_before(text: str) -> None:
    spec = parse(text)
    train, test, truth = generate(spec)
    assert spec.ids == "permuted"
    assert digest((train, test), truth(np.arange(spec.features))) == PERMUTED_DIGESTS[text]


@pytest.mark.parametrize(("written", "features"), [
    ("2^40", 2**40), ("10^9", 10**9), ("1_000_000", 10**6), ("2^62", 2**62), ("3^4", 81)])
def test_features_may_be_written_as_powers(written: str, features: int) -> None:
    assert parse(f"sparse-synthetic:features={written}").features == features


@pytest.mark.parametrize(("text", "ids"), [
    ("sparse-synthetic", "permuted"),
    ("sparse-synthetic:features=10^7", "permuted"),
    ("sparse-synthetic:features=10000001", "hashed"),
    ("sparse-synthetic:features=1000,ids=hashed", "hashed"),
    ("sparse-synthetic:features=2^40,ids=auto", "hashed"),
])
def test_ids_auto_resolves_and_the_spec_written_out_says_which(text: str, ids: str) -> None:
    spec = parse(text)
    assert spec.ids == ids and f",ids={ids}" in canonical(spec)
    assert parse(canonical(spec)) == spec and canonical(parse(canonical(spec))) == canonical(spec)


def zipf_pmf(n: int, alpha: float) -> np.ndarray:
    weights = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    pmf: np.ndarray = weights / weights.sum()
    return pmf


@pytest.mark.parametrize("alpha", [0.7, 1.0, 1.1, 2.0, 1 - 1e-9, 0.05, 3.0])
def test_the_zipf_sampler_draws_the_exact_distribution(alpha: float) -> None:
    """Chi-square against the exact pmf on 1..50: a sampler one rank off scores in the
    tens of thousands; the exact one's statistic is chi-square with 49 degrees of freedom."""
    n, draws = 50, 1_000_000
    ranks = zipf_ranks(np.random.default_rng(7), draws, alpha, n)
    assert ranks.dtype == np.int64 and ranks.min() >= 1 and ranks.max() <= n
    counts = np.bincount(ranks, minlength=n + 1)[1:]
    expected = zipf_pmf(n, alpha) * draws
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert chi2.sf(statistic, n - 1) > 1e-4
    assert np.abs(counts / draws - zipf_pmf(n, alpha)).max() < 2e-3
    shifted = np.bincount(np.minimum(ranks + 1, n), minlength=n + 1)[1:]
    assert ((shifted - expected) ** 2 / expected).sum() > 100 * statistic


@pytest.mark.parametrize("alpha", [0.05, 1.0, 1.1, 3.0])
@pytest.mark.parametrize("n", [1, 2, 3, 2**40, 2**62])
def test_zipf_ranks_stay_in_range(alpha: float, n: int) -> None:
    ranks = zipf_ranks(np.random.default_rng(1), 200_000, alpha, n)
    assert ranks.min() >= 1 and ranks.max() <= n


def zipf_cdf(k: float, n: int, alpha: float) -> float:
    """P(rank <= k) on 1..n: ranks up to 10^5 summed, the rest by the midpoint rule (the
    integral of x^-alpha over [j - 1/2, j + 1/2] is j^-alpha to within 10^-11 of it there)."""
    head = np.arange(1, 100_001, dtype=np.float64) ** -alpha

    def total(upto: float) -> float:
        if upto <= len(head):
            return float(head[:int(upto)].sum())
        low, high = len(head) + 0.5, upto + 0.5
        tail = (np.log(high / low) if alpha == 1 else
                (high ** (1 - alpha) - low ** (1 - alpha)) / (1 - alpha))
        return float(head.sum() + tail)

    return total(k) / total(n)


@pytest.mark.parametrize("n", [10**6, 2**40, 2**53, 2**62])
@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0, 1.1, 2.0])
def test_zipf_ranks_follow_the_distribution_over_any_range_of_ranks(n: int, alpha: float) -> None:
    """The cumulative frequencies within 5 standard errors, up to ranks float64 no longer tells
    apart one by one (module docstring: there they are drawn in the right proportion)."""
    draws = 500_000
    ranks = np.sort(zipf_ranks(np.random.default_rng(3), draws, alpha, n))
    for k in (1, 10, 1000, n // 10**6, n // 10, n // 4, n // 2, n - 1):
        p = zipf_cdf(k, n, alpha)
        seen = np.searchsorted(ranks, k, side="right") / draws
        assert abs(seen - p) <= 5 * np.sqrt(p * (1 - p) / draws) + 1e-12, (k, seen, p)


HASHED = "sparse-synthetic:features=1000000000,samples=20000,test=2000,seed=5"


def test_hashed_ids_are_the_ranks_hashed_and_come_again_from_the_seed() -> None:
    spec = parse(HASHED)
    train, test, _ = generate(spec)
    again, _, _ = generate(spec)
    np.testing.assert_array_equal(train.indices, again.indices)
    np.testing.assert_array_equal(train.labels, again.labels)
    assert spec.ids == "hashed" and train.indices.dtype == np.int32
    assert train.indices.min() >= 0 and train.indices.max() < spec.features
    ids, counts = np.unique(train.indices, return_counts=True)
    ranked = ids[np.argsort(counts)[::-1][:3]]  # rank 1, 2, 3 are the most frequent features
    np.testing.assert_array_equal(ranked, mix64(np.arange(1, 4), 5) % np.uint64(spec.features))
    other, _, _ = generate(parse(HASHED.replace("seed=5", "seed=6")))
    assert np.isin(ranked, other.indices[:1000]).sum() < 3
    assert 0.3 < train.labels.mean() < 0.7 and len(test) == 2000


def test_the_hashed_true_weights_are_per_id_hashes() -> None:
    spec = parse(HASHED)
    _, _, truth = generate(spec)
    ids = np.array([0, 17, 10**9 - 1, 123_456_789], dtype=np.int64)
    expected = np.where(unit_uniform(ids, 6) < spec.density, unit_normal(ids, 7), 0.0)
    np.testing.assert_array_equal(truth(ids), expected.astype(np.float32))
    share = np.mean(truth(np.arange(100_000)) != 0)
    assert truth(ids).dtype == np.float32 and 0.09 < share < 0.11


@pytest.mark.parametrize(("text", "dtype"), [
    ("sparse-synthetic:features=2^40,nnz=50,alpha=1.1", np.int64),
    ("sparse-synthetic:features=1000000000", np.int32),
])
def test_a_billion_and_2_to_the_40_features_generate_in_seconds_and_little_memory(
        text: str, dtype: type) -> None:
    spec = parse(text)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        train, test, truth = generate(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    took = time.perf_counter() - started
    assert len(train) == 100_000 and len(test) == 10_000
    assert train.indices.dtype == dtype and test.indices.dtype == dtype
    assert train.indices.min() >= 0 and train.indices.max() < spec.features
    assert peak < 512 * 2**20  # about 100 MiB here, of which 60 the splits themselves
    assert took < 30  # about 0.5 s here
    lengths = np.diff(train.indptr)
    assert lengths.max() <= 50 and lengths.mean() > 30
    assert 0.3 < train.labels.mean() < 0.7
    features = np.unique(train.indices)
    assert 0.09 < np.mean(truth(features) != 0) < 0.11


def test_a_click_data_set_has_the_share_of_clicks_it_asks_for() -> None:
    train, test, _ = generate(parse("sparse-synthetic:features=2^30,nnz=26,samples=20000,"
                                    "test=5000,ctr=0.2"))
    both = np.concatenate([train.labels, test.labels])
    assert both.mean() == pytest.approx(0.2, abs=1 / len(both))  # the top fifth, ties aside
    assert abs(test.labels.mean() - 0.2) < 0.02
    with pytest.raises(ConfigError, match="ctr must be in"):
        parse("sparse-synthetic:ctr=1")
