"""The gradient noise scale estimators, against a synthetic problem whose noise scale is known
in closed form (the efficiency model: test_noise_efficiency.py).

Per-sample gradients g_i = G + e_i with e_i ~ N(0, sigma^2 I_d): the covariance of one
sample's gradient is sigma^2 I_d, so tr(S) = d sigma^2 and B_simple = d sigma^2 / |G|^2. A
mean over b samples is G + N(0, sigma^2/b I_d), drawn directly. Only the standard library's
`random`, with fixed seeds: every number below is reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from app.core.learning_rate.noise_scale import (
    SIGN_DISAGREEMENT,
    StepEstimate,
    doubts,
    estimate,
    moving_average,
    step_estimate,
    two_batch,
)


class Problem:
    """Gradients of dimension `d` with true gradient G = (|G|, 0, ..., 0) and per-sample
    noise sigma^2 I_d."""

    def __init__(self, d: int, sigma: float, gradient_sq: float) -> None:
        self.d, self.sigma = d, sigma
        self.gradient = [math.sqrt(gradient_sq)] + [0.0] * (d - 1)
        self.gradient_sq = gradient_sq
        self.trace = d * sigma**2
        self.b_simple = self.trace / gradient_sq

    def mean_gradient(self, rng: random.Random, batch: int) -> list[float]:
        """The mean gradient of `batch` independent samples."""
        spread = self.sigma / math.sqrt(batch)
        return [g + rng.gauss(0.0, spread) for g in self.gradient]

    def ddp_step(self, rng: random.Random, sizes: Sequence[int]) -> StepEstimate:
        """One DDP step: replica r's gradient is a mean over sizes[r] samples, the all-reduced
        one the mean over all of them (loss-scaled, so weighted by size on an uneven split)."""
        replicas = [self.mean_gradient(rng, b) for b in sizes]
        total = sum(sizes)
        big = [
            math.fsum(b * v[i] for b, v in zip(sizes, replicas, strict=True)) / total for i in range(self.d)
        ]
        small = [(sq_norm(v), float(b)) for v, b in zip(replicas, sizes, strict=True)]
        return step_estimate(small, sq_norm(big), total)


def sq_norm(v: Sequence[float]) -> float:
    return math.fsum(x * x for x in v)


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def assert_unbiased(values: Sequence[float], truth: float, within: float = 4.0) -> None:
    mean, se = mean_and_stderr(values)
    assert abs(mean - truth) <= within * se, (
        f"mean {mean} is {abs(mean - truth) / se:.1f} standard errors from {truth}"
    )


# ------------------------------------------------------------------------- two_batch


def test_two_batch_inverts_the_expected_norms_exactly() -> None:
    # E|G_b|^2 = |G|^2 + tr(S)/b: fed the expectations, the estimator returns the truth.
    gradient_sq, trace = 0.25, 12.0
    for b, big in [(1, 2), (8, 64), (32, 4096), (3.5, 7)]:
        result = two_batch(gradient_sq + trace / b, b, gradient_sq + trace / big, int(big))
        assert result.gradient_sq == pytest.approx(gradient_sq, rel=1e-12)
        assert result.trace == pytest.approx(trace, rel=1e-12)
        assert result.b_simple == pytest.approx(trace / gradient_sq, rel=1e-12)
        assert (result.small_batch, result.big_batch) == (b, big)


def test_two_batch_is_unbiased_on_the_synthetic_problem() -> None:
    problem = Problem(d=6, sigma=1.0, gradient_sq=0.2)  # B_simple = 30
    rng = random.Random(20181214)
    pairs = [
        two_batch(sq_norm(problem.mean_gradient(rng, 8)), 8, sq_norm(problem.mean_gradient(rng, 64)), 64)
        for _ in range(4000)
    ]
    assert_unbiased([p.gradient_sq for p in pairs], problem.gradient_sq)
    assert_unbiased([p.trace for p in pairs], problem.trace)
    # One pair alone is noisy: its |G|^2 estimate is often not even positive.
    assert any(p.b_simple is None for p in pairs)


def test_b_simple_is_none_unless_both_estimates_are_positive() -> None:
    assert StepEstimate(gradient_sq=-0.1, trace=1.0, small_batch=1, big_batch=2).b_simple is None
    assert StepEstimate(gradient_sq=0.0, trace=1.0, small_batch=1, big_batch=2).b_simple is None
    assert StepEstimate(gradient_sq=1.0, trace=-1.0, small_batch=1, big_batch=2).b_simple is None
    assert StepEstimate(gradient_sq=0.5, trace=2.0, small_batch=1, big_batch=2).b_simple == 4.0


@pytest.mark.parametrize(("small", "big"), [(0, 8), (-1, 8), (8, 8), (9, 8), (0.0, 1)])
def test_two_batch_needs_a_smaller_positive_small_batch(small: float, big: int) -> None:
    with pytest.raises(ValueError, match="small batch"):
        two_batch(1.0, small, 0.5, big)


# --------------------------------------------------------------------- step_estimate


def test_step_estimate_is_the_mean_of_the_replicas_two_batch_estimates() -> None:
    small = [(2.0, 4.0), (1.5, 6.0), (1.2, 8.0)]
    result = step_estimate(small, 0.9, 18)
    pairs = [two_batch(sq, b, 0.9, 18) for sq, b in small]
    assert result.gradient_sq == pytest.approx(sum(p.gradient_sq for p in pairs) / 3, rel=1e-15)
    assert result.trace == pytest.approx(sum(p.trace for p in pairs) / 3, rel=1e-15)
    assert (result.small_batch, result.big_batch) == (6.0, 18)


@pytest.mark.parametrize("sizes", [[16, 16, 16, 16], [5, 9, 8, 10]], ids=["even", "uneven"])
def test_step_estimate_is_unbiased_under_ddp(sizes: list[int]) -> None:
    problem = Problem(d=8, sigma=1.0, gradient_sq=0.5)  # B_simple = 16
    rng = random.Random(sum(sizes))
    steps = [problem.ddp_step(rng, sizes) for _ in range(2000)]
    assert_unbiased([s.gradient_sq for s in steps], problem.gradient_sq)
    assert_unbiased([s.trace for s in steps], problem.trace)
    assert {s.big_batch for s in steps} == {sum(sizes)}


def test_step_estimate_needs_a_small_batch() -> None:
    with pytest.raises(ValueError, match="at least one"):
        step_estimate([], 1.0, 8)
    with pytest.raises(ValueError, match="small batch"):
        step_estimate([(1.0, 8.0)], 0.5, 8)


# -------------------------------------------------------------------- moving_average


def test_moving_average_is_bias_corrected() -> None:
    assert moving_average([3.5]) == pytest.approx(3.5, rel=1e-15)
    assert moving_average([2.0] * 50, 0.9) == pytest.approx(2.0, rel=1e-12)
    # Two values: weights d(1 - d) and (1 - d), over 1 - d^2, give (d a + b) / (1 + d).
    for decay in (0.0, 0.5, 0.9, 0.99):
        assert moving_average([1.0, 5.0], decay) == pytest.approx(
            (decay * 1.0 + 5.0) / (1 + decay), rel=1e-12
        )
    # Recent values weigh more, and decay 0 is the last value alone.
    assert moving_average([0.0, 0.0, 1.0], 0.9) > 1 / 3 > moving_average([1.0, 0.0, 0.0], 0.9)
    assert moving_average([7.0, -2.0, 4.0], 0.0) == 4.0


def test_moving_average_weights_are_exponential() -> None:
    values = [0.3, -0.7, 1.9, 0.05, 2.5]
    decay = 0.8
    weights = [decay ** (len(values) - 1 - k) for k in range(len(values))]
    expected = math.fsum(w * v for w, v in zip(weights, values, strict=True)) / math.fsum(weights)
    assert moving_average(values, decay) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("decay", [1.0, 1.5, -0.1, float("nan")])
def test_moving_average_rejects_decays_outside_0_1(decay: float) -> None:
    with pytest.raises(ValueError, match="decay"):
        moving_average([1.0], decay)


def test_moving_average_needs_values() -> None:
    with pytest.raises(ValueError, match="no values"):
        moving_average([])


# -------------------------------------------------------------------------- estimate

# B_simple = 8 * 1 / 0.5 = 16 with replicas of 16 and a big batch of 64: a setting where 40
# steps measure it to about 13%.
PROBLEM = Problem(d=8, sigma=1.0, gradient_sq=0.5)
SIZES = [16, 16, 16, 16]
STEPS = 40
REPEATS = 300


@pytest.fixture(scope="module")
def repeated() -> list[list[StepEstimate]]:
    """REPEATS independent measurements of STEPS steps each."""
    rng = random.Random(2018)
    return [[PROBLEM.ddp_step(rng, SIZES) for _ in range(STEPS)] for _ in range(REPEATS)]


def test_estimate_averages_unbiased_quantities_and_divides_last(repeated: list[list[StepEstimate]]) -> None:
    results = [estimate(steps) for steps in repeated]
    # The moving averages of |G|^2 and tr(S) are unbiased; their ratio only to first order.
    assert_unbiased([r.gradient_sq for r in results], PROBLEM.gradient_sq)
    assert_unbiased([r.trace for r in results], PROBLEM.trace)
    values = [r.b_simple for r in results]
    assert all(v is not None for v in values)
    mean = math.fsum(v for v in values if v is not None) / len(values)
    assert mean == pytest.approx(PROBLEM.b_simple, rel=0.05)
    first = results[0]
    assert first.gradient_sq == pytest.approx(moving_average([s.gradient_sq for s in repeated[0]]), rel=1e-15)
    assert first.b_simple == pytest.approx(first.trace / first.gradient_sq, rel=1e-15)
    assert (first.steps, first.decay, first.history) == (STEPS, 0.9, tuple(repeated[0]))
    assert len(first.running) == STEPS and first.running[-1] == first.b_simple
    assert first.relative_stderr == pytest.approx(first.stderr / first.b_simple)  # type: ignore[operator]


def test_estimate_stderr_is_a_calibrated_uncertainty(repeated: list[list[StepEstimate]]) -> None:
    results = [estimate(steps) for steps in repeated]
    pairs = [(r.b_simple, r.stderr) for r in results if r.b_simple is not None and r.stderr is not None]
    assert len(pairs) == REPEATS
    covered = sum(abs(value - PROBLEM.b_simple) <= 2 * se for value, se in pairs) / REPEATS
    assert 0.85 <= covered <= 0.99, f"+/- 2 stderr covered the truth {covered:.1%} of the time"
    # And its size is the spread of the estimates themselves, not just wide enough.
    spread = math.sqrt(mean_and_stderr([v for v, _ in pairs])[1] ** 2 * REPEATS)
    typical = math.sqrt(math.fsum(se * se for _, se in pairs) / REPEATS)
    assert 0.75 <= typical / spread <= 1.33, (typical, spread)


def test_more_steps_measure_more_precisely() -> None:
    rng = random.Random(7)
    steps = [PROBLEM.ddp_step(rng, SIZES) for _ in range(200)]
    short, long = estimate(steps[:20], decay=0.99), estimate(steps, decay=0.99)
    assert short.stderr is not None and long.stderr is not None
    assert long.stderr < short.stderr
    assert long.b_simple == pytest.approx(PROBLEM.b_simple, abs=4 * long.stderr)


def test_estimate_of_one_step_has_no_stderr_and_noise_alone_has_no_value() -> None:
    one = estimate([StepEstimate(gradient_sq=0.5, trace=8.0, small_batch=16, big_batch=64)])
    assert (one.b_simple, one.stderr, one.relative_stderr) == (16.0, None, None)
    lost = estimate([StepEstimate(gradient_sq=-0.1, trace=8.0, small_batch=16, big_batch=64)] * 3)
    assert (lost.b_simple, lost.stderr, lost.relative_stderr) == (None, None, None)
    assert lost.running == (None, None, None)


def test_estimate_needs_steps() -> None:
    with pytest.raises(ValueError, match="no steps"):
        estimate([])
    with pytest.raises(ValueError, match="decay"):
        estimate([StepEstimate(gradient_sq=0.5, trace=8.0, small_batch=16, big_batch=64)], decay=1.0)


# ------------------------------------------------------------------------- doubts


def test_a_clear_estimate_has_no_doubts() -> None:
    """B_simple 8 measured with replicas of 16 and a global batch of 64: every step agrees."""
    problem, rng = Problem(d=8, sigma=1.0, gradient_sq=1.0), random.Random(5)
    result = estimate([problem.ddp_step(rng, [16] * 4) for _ in range(8)])
    assert all(s.gradient_sq > 0 and s.trace > 0 for s in result.history)
    assert result.stderr is not None and doubts(result) == []


def test_steps_that_disagree_in_sign_are_doubted_whatever_the_average_says() -> None:
    """B_simple 512 against a global batch of 64: |G|^2 is lost in the noise, and the
    per-step estimates come out negative almost as often as positive. The average is
    positive and has a standard error, which claims a precision the steps do not have."""
    problem, rng = Problem(d=8, sigma=1.0, gradient_sq=1 / 64), random.Random(1)
    result = estimate([problem.ddp_step(rng, [16] * 4) for _ in range(8)])
    negative = sum(s.gradient_sq <= 0 for s in result.history)
    assert negative / result.steps >= SIGN_DISAGREEMENT
    assert result.b_simple is not None and result.stderr is not None
    assert abs(result.b_simple - problem.b_simple) > 4 * result.stderr
    [reason, *_] = doubts(result)
    assert "disagree in sign" in reason and f"{negative} of 8" in reason


def test_an_estimate_without_a_standard_error_is_doubted() -> None:
    problem, rng = Problem(d=8, sigma=1.0, gradient_sq=1.0), random.Random(5)
    result = estimate([problem.ddp_step(rng, [16] * 4)])
    assert result.b_simple is not None and result.stderr is None
    assert any("no standard error" in reason for reason in doubts(result))
