"""The efficiency model of the gradient noise scale (McCandlish et al. 2018): steps and samples
against the batch, the verdicts and recommendations, the refusals and the readable numbers."""

from __future__ import annotations

import pytest

from app.core.learning_rate.noise_scale import NEAR_FACTOR, efficiency, readable

U = 2.0**-52  # one unit in the last place of 1.0
BATCHES = [1, 2, 3, 7, 64, 100, 512, 1000, 4096, 65536, 2**20, 2**40, 2**53 - 1]
NOISE_SCALES = [0.37, 1.0, 3.7, 100.0, 1234.5, 4096.0, 1e5, 1e7, 2.0**45]


@pytest.mark.parametrize("noise", NOISE_SCALES)
def test_steps_and_samples_trade_off_as_mccandlish_et_al(noise: float) -> None:
    for batch in BATCHES:
        e = efficiency(batch, noise)
        x = noise / batch
        assert e.steps_vs_min == 1 + x and e.samples_vs_min == 1 + batch / noise
        assert e.batch_to_critical == batch / noise
        assert (e.batch_size, e.gradient_noise_scale, e.critical_batch_size) == (batch, noise, noise)
        assert e.step_efficiency == 1 / e.steps_vs_min and e.sample_efficiency == 1 / e.samples_vs_min
        # (S/S_min - 1)(E/E_min - 1) = 1, up to the rounding of 1 + x and 1 + 1/x ...
        bound = 4 * U * (2 + x + 1 / x)
        assert abs((e.steps_vs_min - 1) * (e.samples_vs_min - 1) - 1) <= bound
        # ... which is S_min/S + E_min/E = 1, with no cancellation at all.
        assert abs(e.step_efficiency + e.sample_efficiency - 1) <= 4 * U


def test_the_identity_is_exact_where_the_arithmetic_is() -> None:
    # Powers of two within 2^52 of each other: every sum and quotient is exact, so is the identity.
    for k in range(0, 40):
        for j in range(k - 52, 53):
            e = efficiency(2**k, 2.0**j)
            assert (e.steps_vs_min - 1) * (e.samples_vs_min - 1) == 1.0
            assert e.step_efficiency + e.sample_efficiency == 1.0


def test_at_the_critical_batch_steps_and_samples_are_both_twice_the_minimum() -> None:
    e = efficiency(4096, 4096.0)
    assert (e.steps_vs_min, e.samples_vs_min, e.step_efficiency, e.sample_efficiency) == (2.0, 2.0, 0.5, 0.5)
    assert e.verdict == "near_critical"


@pytest.mark.parametrize(
    ("batch", "noise", "verdict"),
    [
        (2048, 1024.0, "near_critical"),  # exactly NEAR_FACTOR above
        (2049, 1024.0, "above_critical"),
        (512, 1024.0, "near_critical"),  # exactly NEAR_FACTOR below
        (511, 1024.0, "below_critical"),
        (1024, 1024.0, "near_critical"),
        (1, 1e7, "below_critical"),
        (2**40, 1.0, "above_critical"),
        (1500, 1000.0, "near_critical"),
        (600, 1000.0, "near_critical"),
    ],
)
def test_verdict_thresholds(batch: int, noise: float, verdict: str) -> None:
    assert NEAR_FACTOR == 2.0
    e = efficiency(batch, noise)
    assert e.verdict == verdict
    near = 1 / NEAR_FACTOR <= e.batch_to_critical <= NEAR_FACTOR
    assert (e.verdict == "near_critical") == near
    # Inside the band neither efficiency drops below 1/3.
    if near:
        assert min(e.step_efficiency, e.sample_efficiency) >= 1 / 3 - 1e-15


def test_recommendations_give_the_numbers_and_the_way_out() -> None:
    below = efficiency(512, 4096.0, stderr=300.0)
    assert below.recommendation.startswith(
        "global batch 512 is 0.125x the critical batch (about 4096 +/- 300 samples): it needs 9x the "
        "fewest possible optimizer steps and 1.12x the fewest possible samples"
    )
    assert "4.5x fewer steps" in below.recommendation and "1.78x the samples" in below.recommendation
    above = efficiency(65536, 4096.0)
    assert "17x the fewest possible samples" in above.recommendation
    assert "8.5x fewer samples" in above.recommendation and "+/-" not in above.recommendation
    assert "good trade" in efficiency(4096, 4096.0).recommendation
    # No exponent notation for batch sizes in a sentence.
    assert "e+" not in efficiency(2**20, 1e6).recommendation


@pytest.mark.parametrize(
    ("batch", "noise", "stderr", "match"),
    [
        (0, 100.0, None, "batch size"),
        (-4, 100.0, None, "batch size"),
        (64, 0.0, None, "noise scale"),
        (64, -1.0, None, "noise scale"),
        (64, float("nan"), None, "noise scale"),
        (64, float("inf"), None, "noise scale"),
        (64, 100.0, -1.0, "standard error"),
        (64, 100.0, float("nan"), "standard error"),
        (64, 100.0, float("inf"), "standard error"),
        (2**53 - 1, 5e-324, None, "too small"),
    ],
)
def test_efficiency_rejects_bad_input(batch: int, noise: float, stderr: float | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        efficiency(batch, noise, stderr)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (4096.0, "4096"),
        (1.125, "1.12"),
        (0.125, "0.125"),
        (9.0, "9"),
        (0.0123, "0.0123"),
        (999.7, "1000"),
        (2.0**40, "1099511627776"),
        (1e-7, "1e-07"),
        (1e20, "1e+20"),
        (0.0, "0"),
    ],
)
def test_readable_numbers(value: float, text: str) -> None:
    assert readable(value) == text
