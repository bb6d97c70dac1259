"""Learning-rate schedules and staleness-aware rules: exact factors, and their effect on a
shard's parameters (a push τ updates stale is applied at 1/(τ+1) of its size under dynsgd)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.config import LearningConfig, RunConfig
from engine.consistency.base import ASP, BSP
from engine.errors import ConfigError
from engine.keys import KeyRange
from engine.plan import build_config
from engine.server.learning import (
    PLAIN,
    Cosine,
    Learning,
    SplitGradients,
    StepDecay,
    WarmUp,
    make_learning,
    make_rule,
    make_schedule,
)
from engine.server.optimizers import SGD
from engine.server.shard import ShardState
from engine.server.update import Update
from psctl.learnopts import parse_schedule

KEYS = KeyRange(0, 4)
GRAD = np.array([1.0, -2.0, 0.5, 4.0], dtype=np.float32)


def learning(workers: int = 4, divisor: int = 4, **settings: object) -> Learning:
    config = LearningConfig.model_validate(settings)
    return Learning(make_schedule(config), make_rule(config, workers, divisor, len(KEYS)))


def push(worker: int, tau: int, values: np.ndarray = GRAD) -> tuple[int, int, Update]:
    return worker, tau, Update(slice(0, len(values)), values)


def test_schedules_give_their_exact_factors() -> None:
    step = StepDecay(every=100, gamma=0.5)
    assert [step.factor(s) for s in (0, 99, 100, 250)] == [1.0, 1.0, 0.5, 0.25]
    cosine = Cosine(total=200, floor=0.1)
    assert cosine.factor(0) == pytest.approx(1.0)
    assert cosine.factor(100) == pytest.approx(0.55)
    assert cosine.factor(200) == pytest.approx(0.1) == cosine.factor(10_000)
    warm = WarmUp(4, StepDecay(every=10, gamma=0.1))
    assert [warm.factor(s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert warm.factor(14) == pytest.approx(0.1)  # the decay counts from the end of the warm-up
    made = make_schedule(LearningConfig(schedule="cosine", total=1000, warmup=10))
    assert isinstance(made, WarmUp) and made.factor(10 + 500) == pytest.approx(0.5)
    assert PLAIN.scale(10**6, push(3, 50)) == 1.0


def test_schedules_match_torch_lr_schedulers() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50, eta_min=0.2 * 0.05)
    ours = Cosine(total=50, floor=0.05)
    for step in range(51):  # past T_max torch's cosine rises again; ours stays at the floor
        assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * ours.factor(step), abs=1e-9)
        opt.step()
        sched.step()


@pytest.mark.parametrize("tau", [0, 1, 3, 10])
def test_dynsgd_scales_a_push_by_one_over_staleness_plus_one(tau: int) -> None:
    rule = learning(rule="dynsgd")  # λ = 1/workers: relative 1 to the mean's own 1/4
    assert rule.scale(0, push(0, tau)) == pytest.approx(1 / (tau + 1))
    assert rule.scale(0) == 1.0  # a BSP round's mean: the schedule alone


def test_consgd_is_the_global_rate_relative_to_the_aggregator() -> None:
    assert learning(rule="consgd").scale(0, push(1, 5)) == pytest.approx(1.0)  # mean: today's
    assert learning(rule="consgd", global_lr=0.5).scale(0, push(1, 5)) == pytest.approx(2.0)
    # With push_scale sum the aggregator divides by 1: λ is the whole multiplier.
    assert learning(divisor=1, rule="consgd", global_lr=0.5).scale(0, push(1, 0)) == 0.5
    assert learning(divisor=1, rule="consgd").scale(0, push(1, 0)) == pytest.approx(0.25)


def test_dynssgc_follows_the_maximum_staleness_of_the_window() -> None:
    rule = learning(rule="dynssgc", window=3)
    factors = [rule.scale(0, push(0, tau)) for tau in (0, 4, 1, 1, 1, 0)]
    # max over the last three pushes: 0, 4, 4, 4, 1, 1
    assert factors == pytest.approx([1, 1 / 5, 1 / 5, 1 / 5, 1 / 2, 1 / 2])
    assert learning(rule="dynssgc", workers=3).rule._recent.maxlen == 6  # type: ignore[attr-defined]


def _asp_shard(rule: Learning, workers: int = 4) -> ShardState:
    state = ShardState(KEYS, ASP(workers), SGD(len(KEYS), lr=1.0), workers=workers,
                       learning=rule)
    state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    return state


def test_a_push_three_updates_stale_moves_the_shard_a_quarter_as_far() -> None:
    state = _asp_shard(learning(rule="dynsgd"))
    before = state.params.copy()
    state.push(0, 0, KEYS, GRAD, base_version=0)  # fresh: τ = 0
    fresh = before - state.params
    for worker in (1, 2):
        state.push(worker, 0, KEYS, GRAD, base_version=state.version)
    before = state.params.copy()
    accepted = state.push(3, 0, KEYS, GRAD, base_version=0)  # computed on version 0
    assert accepted == 3
    np.testing.assert_allclose(before - state.params, fresh / 4, rtol=1e-6)
    np.testing.assert_allclose(fresh, GRAD / 4, rtol=1e-6)  # the mean's 1/workers, lr 1


def test_without_a_rule_staleness_changes_nothing() -> None:
    state = _asp_shard(PLAIN)
    for worker in range(3):
        before = state.params.copy()
        state.push(worker, 0, KEYS, GRAD, base_version=0)
        np.testing.assert_allclose(before - state.params, GRAD / 4, rtol=1e-6)


def test_a_schedule_is_indexed_by_the_updates_of_the_keys() -> None:
    rule = learning(schedule="step", step_every=2, gamma=0.5)
    state = ShardState(KEYS, BSP(1), SGD(len(KEYS), lr=1.0), workers=1, learning=rule)
    state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    moves = []
    for clock in range(5):
        before = state.params.copy()
        state.push(0, clock, KEYS, GRAD)
        moves.append(float((before - state.params)[0]))
    assert moves == pytest.approx([1, 1, 0.5, 0.5, 0.25])


def test_the_shard_reports_the_scale_each_push_got() -> None:
    state = _asp_shard(learning(rule="dynsgd"))
    state.push(0, 0, KEYS, GRAD, base_version=0)
    assert state.last_scale == pytest.approx(1 / 4)  # the mean over 4 workers, τ = 0
    for worker in (1, 2):
        state.push(worker, 0, KEYS, GRAD, base_version=state.version)
    state.push(3, 0, KEYS, GRAD, base_version=0)  # τ = 3
    assert state.last_scale == pytest.approx(1 / 16)
    state.push(0, 1, KEYS, np.zeros(0, dtype=np.float32), index=np.zeros(0, dtype=np.uint32))
    assert state.last_scale is None  # an empty push carried nothing to scale


def test_a_bsp_contribution_reports_the_factor_of_its_round() -> None:
    rule = learning(schedule="step", step_every=2, gamma=0.5)
    state = ShardState(KEYS, BSP(2), SGD(len(KEYS), lr=1.0), workers=2, learning=rule)
    state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    scales = []
    for clock in range(4):
        for worker in (0, 1):
            state.push(worker, clock, KEYS, GRAD)
            scales.append(state.last_scale)
    # Rounds 0 and 1 at the full rate, 2 and 3 halved, each push weighing 1/2 of its round.
    assert scales == pytest.approx([0.5] * 4 + [0.25] * 4)


def test_a_schedule_by_epoch_follows_the_clock_of_the_push() -> None:
    config = LearningConfig(schedule="step", step_every=2, gamma=0.5, unit="epochs")
    made = make_learning(config, workers=1, divisor=1, size=len(KEYS))
    made.start(10)  # ten clocks an epoch: decays at clocks 20 and 40
    state = ShardState(KEYS, ASP(1), SGD(len(KEYS), lr=1.0), workers=1, learning=made)
    state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    scales = {}
    for clock in range(45):
        state.push(0, clock, KEYS, GRAD, base_version=state.version)
        scales[clock] = state.last_scale
    assert [scales[c] for c in (0, 19, 20, 39, 40, 44)] == [1, 1, 0.5, 0.5, 0.25, 0.25]


def test_warm_up_and_cosine_by_epoch_count_fractional_epochs() -> None:
    config = LearningConfig(schedule="cosine", total=2, warmup=1, unit="epochs")
    made = make_learning(config, workers=1, divisor=1, size=len(KEYS))
    made.start(4.0)
    factors = [made.scale(0, clock=c) for c in range(13)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # one epoch of warm-up
    assert factors[8] == pytest.approx(0.5)  # half-way through the two cosine epochs
    assert factors[12] == pytest.approx(0.0)
    # Indexed by updates, the same settings ignore the clock.
    by_update = make_learning(config.model_copy(update={"unit": "updates"}), 1, 1, len(KEYS))
    assert by_update.scale(0, clock=12) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="clocks per epoch"):
        made.start(0)


def test_bad_learning_settings_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match="step needs learning.step_every"):
        build_config({}, {"learning.schedule": "step"})
    with pytest.raises(ConfigError, match="unknown staleness rule 'nope'"):
        build_config({}, {"learning.rule": "nope"})
    with pytest.raises(ConfigError, match="global_lr"):
        build_config({}, {"learning.global_lr": 2.0})
    assert RunConfig().learning == LearningConfig()


@pytest.mark.parametrize(("text", "values"), [
    ("constant", {"learning.schedule": "constant"}),
    ("step:2000", {"learning.schedule": "step", "learning.step_every": 2000}),
    ("step:2000:0.5", {"learning.schedule": "step", "learning.step_every": 2000,
                       "learning.gamma": 0.5}),
    ("cosine:300:0.1", {"learning.schedule": "cosine", "learning.total": 300,
                        "learning.floor": 0.1}),
])
def test_schedule_flag_forms(text: str, values: dict[str, object]) -> None:
    assert parse_schedule(text) == values
    build_config({}, values)  # and the config accepts what it made


@pytest.mark.parametrize("text", ["", "cosine", "step:x", "step:1.5", "linear:3",
                                  "constant:4", "cosine:10:0.1:3"])
def test_bad_schedule_flags_are_refused_plainly(text: str) -> None:
    with pytest.raises(ConfigError, match="--lr-schedule"):
        parse_schedule(text)


def test_cosine_factor_is_half_a_cosine() -> None:
    cosine = Cosine(total=8)
    assert [round(cosine.factor(s), 6) for s in (0, 2, 4, 6, 8)] == [
        1.0, round((1 + math.cos(math.pi / 4)) / 2, 6), 0.5,
        round((1 + math.cos(3 * math.pi / 4)) / 2, 6), 0.0]


def test_adaptive_rates_shrink_with_each_workers_own_pushes() -> None:
    rule = learning(rule="adaptive")  # 4 workers; the mean divided each push by 4
    norm = 4 * float(np.linalg.norm(GRAD))  # the gradient before the mean's division
    first = rule.scale(0, push(0, 0))
    # The push moves the parameters by lr * λ * g / sqrt(|g|^2): a step of length lr / 4.
    assert first * float(np.linalg.norm(GRAD)) == pytest.approx(1 / 4)
    assert first == pytest.approx(1 / norm)  # relative 1 over the raw norm
    assert rule.scale(0, push(0, 0)) == pytest.approx(1 / (norm * np.sqrt(2)))
    assert rule.scale(0, push(0, 0)) == pytest.approx(1 / (norm * np.sqrt(3)))
    # A worker that has pushed less has the larger rate: worker 1's first push.
    assert rule.scale(0, push(1, 0)) == pytest.approx(first)


def _split_invariant(rule: SplitGradients) -> tuple[float, float]:
    """(t * |sum_c alpha_c g_c/|g_c||, |sum_c g_c|) over the workers that have pushed."""
    latest = rule.latest.astype(np.float64)
    norms = np.linalg.norm(latest, axis=1)
    live = norms > 0
    directions = latest[live] / norms[live, None]
    combined = np.linalg.norm((rule.weights[live, None] * directions).sum(axis=0))
    return rule.distance() * float(combined), float(np.linalg.norm(latest.sum(axis=0)))


def test_split_keeps_the_length_of_the_sum_of_the_latest_gradients() -> None:
    rng = np.random.default_rng(7)
    made = learning(workers=3, divisor=3, rule="split")
    rule = made.rule
    assert isinstance(rule, SplitGradients)
    applied = {}
    for step in range(30):
        worker, tau = int(rng.integers(3)), int(rng.integers(5))
        grad = rng.normal(size=len(KEYS)).astype(np.float32) * rng.uniform(0.1, 10)
        factor = made.scale(step, push(worker, tau, grad))
        applied[worker] = factor * grad  # what the optimizer gets: the new distance t * alpha_c
        kept, target = _split_invariant(rule)
        assert kept == pytest.approx(target, rel=1e-5)
        t = rule.distance()
        # alpha_c = 1 (the slide leaves it open; equal distances): every push gets length t,
        # whatever its staleness
        assert float(np.linalg.norm(applied[worker])) == pytest.approx(t, rel=1e-5)
    # With every alpha_c 1, the applied latest gradients sum to exactly the sum's length.
    even = learning(workers=2, divisor=2, rule="split")
    a = np.array([3.0, 0.0, 0.0, 0.0], dtype=np.float32)
    b = np.array([0.0, 1.0, 0.0, 0.0], dtype=np.float32)
    fa, fb = even.scale(0, push(0, 0, a)), even.scale(0, push(1, 0, b))
    t = float(np.linalg.norm(a + b)) / float(np.linalg.norm([1.0, 1.0]))
    assert fb * float(np.linalg.norm(b)) == pytest.approx(t)
    assert fa * 3.0 == pytest.approx(3.0)  # alone at its push: t = |a|, its own length


def test_split_replaces_only_the_keys_a_push_carries() -> None:
    made = learning(workers=2, divisor=2, rule="split")
    rule = made.rule
    assert isinstance(rule, SplitGradients)
    made.scale(0, push(0, 0, GRAD))
    layer = Update(slice(0, 4), np.array([9.0], dtype=np.float32), np.array([2]))
    made.scale(0, (0, 0, layer))
    np.testing.assert_array_equal(rule.latest[0], [1.0, -2.0, 9.0, 4.0])


def test_split_running_sums_stay_exact_over_many_sparse_pushes() -> None:
    size = 50
    config = LearningConfig(rule="split")
    rule = make_rule(config, 3, 3, size)
    assert isinstance(rule, SplitGradients)
    rng = np.random.default_rng(11)
    for _ in range(SplitGradients.REFRESH_EVERY + 40):  # through one exact refresh and beyond
        keys = np.sort(rng.choice(size, size=int(rng.integers(1, size)), replace=False))
        values = (rng.normal(size=len(keys)) * rng.uniform(0.01, 100)).astype(np.float32)
        factor = rule.factor(int(rng.integers(3)), int(rng.integers(4)),
                             Update(slice(0, size), values, keys))
        assert np.isfinite(factor)
        kept, target = _split_invariant(rule)
        assert kept == pytest.approx(target, rel=1e-6)
