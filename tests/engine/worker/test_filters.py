"""Gradient push filters (issue 15, acceptance 1): what each rule selects, and that error
feedback loses nothing."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.errors import ConfigError
from engine.keys import KeyRange
from engine.worker.filters import (
    PRUNE_RULES,
    Dynamic,
    GradientFilter,
    LayerState,
    NoPrune,
    PruneRule,
    Sigma,
    TopK,
    parse_prune,
)

REPO = Path(__file__).resolve().parents[3]
LAYERS = (300, 1000, 7, 1)  # a large layer, a mid one, a tiny one and a scalar


def layered(sizes: tuple[int, ...] = LAYERS) -> tuple[list[KeyRange], int]:
    segments, start = [], 0
    for size in sizes:
        segments.append(KeyRange(start, start + size))
        start += size
    return segments, start


def select(rule: PruneRule, values: list[float], state: LayerState | None = None) -> list[int]:
    chosen = rule.select(torch.tensor(values, dtype=torch.float32), state or LayerState())
    assert chosen.dtype == torch.int64
    return chosen.tolist()


def one_layer(rule: PruneRule, values: list[float], error_feedback: bool = True
              ) -> GradientFilter:
    return GradientFilter(rule, [KeyRange(0, len(values))], len(values),
                          error_feedback=error_feedback)


def push(grad_filter: GradientFilter, values: list[float]) -> list[int]:
    keys, _ = grad_filter.apply(np.array(values, dtype=np.float32))
    return list(keys.tolist())


# -- the rules on constructed inputs ------------------------------------------------------------


def test_topk_sends_the_largest_magnitudes_in_key_order() -> None:
    state = LayerState()
    assert select(TopK(0.5), [0.1, -5.0, 3.0, 0.2, -4.0, 1.0], state) == [1, 2, 4]
    assert state.threshold is not None and float(state.threshold) == 3.0


@pytest.mark.parametrize(("fraction", "size", "count"), [
    (0.25, 10, 3),  # 2.5 rounds up
    (0.07, 100, 7),  # 0.07 · 100 is 7.000000000000001 in floats: the count uses the decimal
    (0.001, 10, 1),  # at least one key
    (0.01, 1, 1),
    (1.0, 5, 5),
])
def test_topk_count_rounds_up_and_sends_at_least_one(fraction: float, size: int,
                                                     count: int) -> None:
    assert TopK(fraction).count(size) == count
    values = [float(i + 1) for i in range(size)]
    assert select(TopK(fraction), values) == list(range(size - count, size))


def test_topk_breaks_ties_towards_the_lower_index() -> None:
    assert select(TopK(0.4), [1.0, -2.0, 2.0, 2.0, 0.5]) == [1, 2]
    assert select(TopK(0.6), [3.0, 1.0, -3.0, 3.0, 3.0]) == [0, 2, 3]


def test_sigma_uses_the_population_std_of_the_signed_values() -> None:
    values = [1.0, 1.0, 1.0, 1.0, 6.0]  # mean 2; population sigma 2, sample sigma sqrt 5 ≈ 2.236
    state = LayerState()
    assert select(Sigma(2.9), values, state) == [4]  # 6 > 5.8; a sample sigma would send nothing
    assert state.threshold is not None and float(state.threshold) == pytest.approx(5.8)
    assert select(Sigma(0.5), values) == [4]  # strictly above: the 1s equal the cut of 1
    # sigma of the signed values is 3 here; sigma of |g| would be 0 and send everything at any k.
    assert select(Sigma(0.5), [3.0, -3.0, 3.0, -3.0]) == [0, 1, 2, 3]
    assert select(Sigma(1.0), [3.0, -3.0, 3.0, -3.0]) == []
    assert select(Sigma(3.0), [0.5]) == [0]  # one entry: sigma = 0


def test_dynamic_threshold_is_the_mean_of_what_passed_the_last_one() -> None:
    grad_filter = one_layer(Dynamic(), [0.0] * 5, error_feedback=False)
    assert grad_filter.thresholds == [None]
    # Call 1: no threshold yet, so the mean |g| = 4; only 10 passes; the next threshold is 10.
    assert push(grad_filter, [1.0, 2.0, -3.0, 4.0, 10.0]) == [4]
    assert grad_filter.thresholds == [4.0]
    # Call 2: 12 and 11 pass 10; the next threshold is their mean, 11.5.
    assert push(grad_filter, [12.0, 1.0, -11.0, 2.0, 0.0]) == [0, 2]
    assert grad_filter.thresholds == [10.0]
    # Call 3: nothing passes 11.5, so the rule restarts from the mean |g| = 3: 4 and 5 pass.
    assert push(grad_filter, [1.0, 2.0, 3.0, -4.0, 5.0]) == [3, 4]
    assert grad_filter.thresholds == [3.0]
    # Call 4: the threshold is 4.5, the mean of 4 and 5.
    assert push(grad_filter, [-5.0, 4.5, 0.0, 0.0, 0.0]) == [0]
    assert grad_filter.thresholds == [4.5]


def test_dynamic_keeps_one_threshold_per_layer() -> None:
    grad_filter = GradientFilter(Dynamic(), [KeyRange(0, 3), KeyRange(3, 6)], 6,
                                 error_feedback=False)
    grad_filter.apply(np.array([1, 2, 6, 10, 20, 60], dtype=np.float32))
    assert grad_filter.thresholds == [3.0, 30.0]
    keys, _ = grad_filter.apply(np.array([7, 5, 0, 61, 0, 0], dtype=np.float32))
    assert keys.tolist() == [0, 3] and grad_filter.thresholds == [6.0, 60.0]


def test_dynamic_with_equal_magnitudes_sends_the_nonzero_entries() -> None:
    state = LayerState()
    assert select(Dynamic(), [0.5], state) == [0]  # a one-entry layer still moves
    assert select(Dynamic(), [2.0, -2.0], LayerState()) == [0, 1]
    assert select(Dynamic(), [0.0, 0.0], state) == []
    assert state.carried is None  # nothing passed: the next call starts afresh


def test_no_prune_sends_everything() -> None:
    assert select(NoPrune(), [0.0, 1.0, -2.0]) == [0, 1, 2]


# -- the filter: keys, values and error feedback ------------------------------------------------


RULES = ["topk:1%", "topk:10%", "sigma:1", "sigma:2", "dynamic", "none"]


def run_steps(grad_filter: GradientFilter, steps: int, seed: int = 0
              ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(sum of the gradients, sum of what was sent, each step's gradient), in float64."""
    rng = np.random.default_rng(seed)
    total = np.zeros(grad_filter.total_keys)
    sent = np.zeros(grad_filter.total_keys)
    grads = []
    for _ in range(steps):
        grad = (rng.standard_normal(grad_filter.total_keys) * 0.1).astype(np.float32)
        keys, values = grad_filter.apply(grad)
        np.add.at(sent, keys, values)
        total += grad
        grads.append(grad)
    return total, sent, grads


@pytest.mark.parametrize("spec", RULES)
def test_error_feedback_loses_nothing(spec: str) -> None:
    segments, num_keys = layered()
    grad_filter = GradientFilter(parse_prune(spec), segments, num_keys)
    total, sent, _ = run_steps(grad_filter, steps=50)
    np.testing.assert_allclose(sent + grad_filter.residual, total, rtol=1e-5, atol=1e-5)
    if spec != "none":
        assert np.abs(grad_filter.residual).sum() > 0  # it did hold something back


@pytest.mark.parametrize("spec", ["topk:1%", "sigma:2", "dynamic"])
def test_momentum_correction_sends_the_sum_of_the_momenta(spec: str) -> None:
    """DGC: u ← m·u + g, v ← v + u, send v[sel], zero u[sel] and v[sel]; so what was sent plus
    the residual v is the sum of every step's u (taken after its update, before masking)."""
    segments, num_keys = layered()
    momentum = 0.9
    grad_filter = GradientFilter(parse_prune(spec), segments, num_keys, momentum=momentum)
    rng = np.random.default_rng(1)
    velocity, momenta, sent = np.zeros(num_keys), np.zeros(num_keys), np.zeros(num_keys)
    for _ in range(50):
        grad = (rng.standard_normal(num_keys) * 0.1).astype(np.float32)
        keys, values = grad_filter.apply(grad)
        velocity = momentum * velocity + grad
        momenta += velocity
        velocity[keys] = 0.0
        np.add.at(sent, keys, values)
    np.testing.assert_allclose(sent + grad_filter.residual, momenta, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", RULES)
def test_without_error_feedback_the_raw_selection_is_sent(spec: str) -> None:
    segments, num_keys = layered()
    grad_filter = GradientFilter(parse_prune(spec), segments, num_keys, error_feedback=False)
    rng = np.random.default_rng(2)
    for _ in range(5):
        grad = rng.standard_normal(num_keys).astype(np.float32)
        keys, values = grad_filter.apply(grad)
        np.testing.assert_array_equal(values, grad[keys])
        assert not grad_filter.residual.any()


def test_topk_keys_are_global_sorted_unique_int64() -> None:
    segments, num_keys = layered()
    grad_filter = GradientFilter(TopK(0.1), segments, num_keys, error_feedback=False)
    grad = np.random.default_rng(3).standard_normal(num_keys).astype(np.float32)
    original = grad.copy()
    keys, values = grad_filter.apply(grad)
    expected = []
    for segment in segments:  # an independent top-k per layer, shifted by the layer's offset
        layer = np.abs(grad[segment.start:segment.end])
        count = max(1, -(-len(layer) // 10))
        expected.extend(sorted(np.argsort(-layer)[:count] + segment.start))
    assert keys.tolist() == expected
    assert keys.dtype == np.int64 and values.dtype == np.float32
    assert np.all(np.diff(keys) > 0)
    assert grad_filter.sent_keys == len(keys) == 30 + 100 + 1 + 1
    assert grad_filter.total_keys == num_keys
    np.testing.assert_array_equal(grad, original)  # the caller's gradient is not written


def test_read_only_and_float64_gradients_are_taken_without_warnings() -> None:
    grad_filter = one_layer(TopK(0.5), [0.0] * 4)
    grad = np.array([1.0, -4.0, 2.0, 3.0], dtype=np.float32)
    grad.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keys, values = grad_filter.apply(grad)
        assert keys.tolist() == [1, 3] and values.tolist() == [-4.0, 3.0]
        keys, values = grad_filter.apply(np.array([1.0, 0.0, 0.0, 0.0]))  # float64
        assert keys.tolist() == [0, 2] and values.tolist() == [2.0, 2.0]  # residual 1 + 1, and 2


def test_the_filter_refuses_what_it_cannot_handle() -> None:
    with pytest.raises(ConfigError, match="follow on"):
        GradientFilter(NoPrune(), [KeyRange(0, 3), KeyRange(4, 6)], 6)
    with pytest.raises(ConfigError, match="cover 6 keys"):
        GradientFilter(NoPrune(), [KeyRange(0, 6)], 7)
    with pytest.raises(ConfigError, match="needs error feedback"):
        GradientFilter(NoPrune(), [KeyRange(0, 6)], 6, error_feedback=False, momentum=0.9)
    with pytest.raises(ConfigError, match="momentum"):
        GradientFilter(NoPrune(), [KeyRange(0, 6)], 6, momentum=1.0)
    with pytest.raises(ConfigError, match="shape"):
        GradientFilter(NoPrune(), [KeyRange(0, 6)], 6).apply(np.zeros(5, dtype=np.float32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_filter_matches_the_cpu_one() -> None:
    segments, num_keys = layered()
    for spec in RULES:
        on_cpu = GradientFilter(parse_prune(spec), segments, num_keys)
        on_gpu = GradientFilter(parse_prune(spec), segments, num_keys, device="cuda")
        rng = np.random.default_rng(4)
        for _ in range(10):
            grad = rng.standard_normal(num_keys).astype(np.float32)
            cpu_keys, cpu_values = on_cpu.apply(grad)
            gpu_keys, gpu_values = on_gpu.apply(grad)
            np.testing.assert_array_equal(gpu_keys, cpu_keys)
            np.testing.assert_allclose(gpu_values, cpu_values, rtol=1e-6)
        total, sent, _ = run_steps(on_gpu, steps=20)
        np.testing.assert_allclose(sent + on_gpu.residual, total, rtol=1e-5, atol=1e-5)


# -- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "rule"), [
    ("topk:1%", TopK(0.01)),
    ("topk:0.1%", TopK(0.001)),
    ("topk:10%", TopK(0.1)),
    ("topk:0.01", TopK(0.01)),
    ("topk:100%", TopK(1.0)),
    ("sigma:2", Sigma(2.0)),
    ("sigma:1.5", Sigma(1.5)),
    ("dynamic", Dynamic()),
    ("none", NoPrune()),
    (" topk:1% ", TopK(0.01)),
])
def test_parse_prune_accepts(spec: str, rule: PruneRule) -> None:
    assert parse_prune(spec) == rule
    assert parse_prune(rule.spec) == rule  # the spec stored with a run reads back


@pytest.mark.parametrize(("spec", "reason"), [
    ("topk:0%", "must lie in"),
    ("topk:150%", "must lie in"),
    ("topk:50", "did you mean 50%"),
    ("topk:abc%", "not a number"),
    ("topk", "share is missing"),
    ("sigma:-1", "must be positive"),
    ("sigma:0", "must be positive"),
    ("sigma:nan", "must be finite"),
    ("sigma:", "multiple is missing"),
    ("dynamic:2", "takes no argument"),
    ("foo:1", "unknown rule 'foo'"),
    ("", "no rule given"),
])
def test_parse_prune_refuses_with_what_to_write(spec: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_prune(spec)
    message = str(caught.value)
    assert reason in message and "\n" not in message
    assert "write topk:P% (e.g. topk:1%)" in message and "sigma:K" in message


def test_the_registry_lists_every_rule_with_a_summary() -> None:
    assert PRUNE_RULES.names() == ("topk", "sigma", "dynamic", "none")
    assert all(entry.summary for entry in PRUNE_RULES)


def test_importing_the_filters_does_not_import_torch() -> None:
    code = "import engine.worker.filters, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# -- Deep Gradient Compression's warm-up and local clipping (Lin et al., ICLR 2018) -------------


def test_dgc_warm_up_lowers_the_share_exponentially_to_the_rules() -> None:
    """Lin et al.: sparsity 75 %, 93.75 %, 98.4375 %, ... over the warm-up epochs, then the
    final one: the share sent is 0.25^(e + 1) while that is above the rule's."""
    from engine.config import CommConfig
    from engine.worker.filters import make_filter

    size = 4096
    config = CommConfig(prune="topk:0.1%", warmup_epochs=4)
    made = make_filter(config, [KeyRange(0, size)], size)
    assert made is not None
    sent = []
    for epoch in range(6):
        made.start_epoch(epoch)
        made.apply(np.random.default_rng(epoch).normal(size=size).astype(np.float32))
        sent.append(made.sent_keys)
    dgc = [max(0.001, 0.25 ** (e + 1)) if e < 4 else 0.001 for e in range(6)]
    assert sent == [int(np.ceil(share * size)) for share in dgc]  # 1024, 256, 64, 16, 5, 5


def test_dgc_local_clipping_scales_the_threshold_by_one_over_sqrt_workers() -> None:
    from engine.config import CommConfig
    from engine.worker.filters import make_filter

    made = make_filter(CommConfig(local_clip=4.0), [KeyRange(0, 2)], 2, workers=4)
    assert made is not None  # dense, but clipped
    grad = np.array([6.0, 8.0], dtype=np.float32)  # norm 10 > 4 / sqrt(4) = 2
    keys, values = made.apply(grad)
    assert keys.tolist() == [0, 1]
    np.testing.assert_allclose(values, grad * 0.2, rtol=1e-6)
    np.testing.assert_array_equal(grad, [6.0, 8.0])  # the caller's gradient is kept
    short = np.array([0.6, 0.8], dtype=np.float32)  # norm 1 <= 2: unchanged
    np.testing.assert_allclose(made.apply(short)[1], short)


def test_dgc_warm_up_needs_a_top_k_share() -> None:
    from engine.plan import build_config

    with pytest.raises(ConfigError, match="needs --prune topk"):
        build_config({}, {"data.dataset": "digits", "comm.prune": "sigma:2",
                          "comm.warmup_epochs": 2})
