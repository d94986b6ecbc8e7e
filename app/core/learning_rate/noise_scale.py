"""The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", appendix A) and what it says about a global batch.

From the squared norms of gradients at two batch sizes b < B, using E|G_b|^2 = |G|^2 + tr(S)/b:

    |G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b)        tr(S) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

each unbiased; B_simple = tr(S) / |G|^2. Under DDP each replica's gradient is a small batch and
the all-reduced one is the big batch, so one optimizer step gives one estimate per replica.
The ratio of two noisy means is biased and noisy itself, so (as the paper does) the two
quantities are averaged over steps first and divided last.

The critical batch B_crit ~ B_noise ~ B_simple trades steps against samples as
(S/S_min - 1)(E/E_min - 1) = 1, with S/S_min = 1 + B_noise/B and E/E_min = 1 + B/B_noise.

Pure: floats in, floats out; the rank program measures the norms with torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.core.records.plan import BatchEfficiency
from app.core.records.record import record

# A global batch within this factor of the critical one is "near" it: both efficiencies are
# at least 1/3 there.
NEAR_FACTOR = 2.0
DEFAULT_DECAY = 0.9
# Steps whose |G|^2 or tr(S) estimate is not positive: at this share or more, the steps
# disagree about the sign of what is averaged, and the average is noise.
SIGN_DISAGREEMENT = 0.25


@record
class StepEstimate:
    """One optimizer step's unbiased estimates of |G|^2 and tr(S), the covariance of one
    sample's gradient."""

    gradient_sq: float
    trace: float
    small_batch: float  # the small batches' mean size
    big_batch: int

    @property
    def b_simple(self) -> float | None:
        return self.trace / self.gradient_sq if self.gradient_sq > 0 and self.trace > 0 else None


def two_batch(small_sq_norm: float, small_batch: float, big_sq_norm: float, big_batch: int) -> StepEstimate:
    """The two-batch estimator for one pair of gradients, of mean losses over `small_batch`
    and `big_batch` samples."""
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small batch < big batch; got {small_batch} and {big_batch}")
    b, B = float(small_batch), float(big_batch)
    return StepEstimate(
        gradient_sq=(B * big_sq_norm - b * small_sq_norm) / (B - b),
        trace=(small_sq_norm - big_sq_norm) / (1 / b - 1 / B),
        small_batch=b,
        big_batch=big_batch,
    )


def step_estimate(small: Sequence[tuple[float, float]], big_sq_norm: float, big_batch: int) -> StepEstimate:
    """One step from every small batch (`(squared norm, samples)` per replica) and the big
    one: the mean of the per-replica estimates, each unbiased, so the mean is too. Replicas
    may hold different numbers of samples (an uneven split)."""
    if not small:
        raise ValueError("need at least one small-batch gradient")
    pairs = [two_batch(sq, b, big_sq_norm, big_batch) for sq, b in small]
    n = len(pairs)
    return StepEstimate(
        gradient_sq=math.fsum(p.gradient_sq for p in pairs) / n,
        trace=math.fsum(p.trace for p in pairs) / n,
        small_batch=math.fsum(b for _, b in small) / n,
        big_batch=big_batch,
    )


def moving_average(values: Sequence[float], decay: float = DEFAULT_DECAY) -> float:
    """Exponential moving average with Adam's bias correction: after one value it is that
    value, and recent steps weigh more as the weights move."""
    if not values:
        raise ValueError("no values")
    if not 0 <= decay < 1:
        raise ValueError(f"decay must be in [0, 1); got {decay}")
    average = 0.0
    for value in values:
        average = decay * average + (1 - decay) * value
    return average / (1 - decay ** len(values))


@record
class NoiseScale:
    """B_simple from the moving averages of |G|^2 and tr(S), with a jackknife standard error
    over steps. `b_simple` is None when the averaged |G|^2 or tr(S) is not positive: the
    gradient is lost in the noise at these batch sizes (measure over more steps or with a
    bigger global batch)."""

    b_simple: float | None
    stderr: float | None
    steps: int
    gradient_sq: float
    trace: float
    decay: float
    history: tuple[StepEstimate, ...]
    running: tuple[float | None, ...]  # b_simple after each step

    @property
    def relative_stderr(self) -> float | None:
        if self.b_simple is None or self.stderr is None:
            return None
        return self.stderr / self.b_simple


def _ratio(steps: Sequence[StepEstimate], decay: float) -> float | None:
    g = moving_average([s.gradient_sq for s in steps], decay)
    t = moving_average([s.trace for s in steps], decay)
    return t / g if g > 0 and t > 0 else None


def estimate(steps: Sequence[StepEstimate], decay: float = DEFAULT_DECAY) -> NoiseScale:
    if not steps:
        raise ValueError("no steps measured")
    value = _ratio(steps, decay)
    stderr = None
    n = len(steps)
    if value is not None and n >= 2:
        leave_one_out = [_ratio([s for j, s in enumerate(steps) if j != k], decay) for k in range(n)]
        known = [v for v in leave_one_out if v is not None]
        if len(known) == n:
            mean = math.fsum(known) / n
            stderr = math.sqrt((n - 1) / n * math.fsum((v - mean) ** 2 for v in known))
    return NoiseScale(
        b_simple=value,
        stderr=stderr,
        steps=n,
        gradient_sq=moving_average([s.gradient_sq for s in steps], decay),
        trace=moving_average([s.trace for s in steps], decay),
        decay=decay,
        history=tuple(steps),
        running=tuple(_ratio(steps[: k + 1], decay) for k in range(n)),
    )


def doubts(result: NoiseScale) -> list[str]:
    """Why `result` cannot carry a recommendation; empty when it can. An estimate without a
    standard error has no stated precision, and one whose steps disagree in sign is a ratio
    of numbers that noise dominates, whatever its standard error says."""
    reasons = []
    if result.b_simple is None:
        reasons.append("the averaged |G|^2 or tr(S) was not positive")
    negative = sum(1 for s in result.history if s.gradient_sq <= 0 or s.trace <= 0)
    if result.steps and negative / result.steps >= SIGN_DISAGREEMENT:
        reasons.append(
            f"the steps disagree in sign: {negative} of {result.steps} gave a negative |G|^2 or "
            f"tr(S) estimate, so the averages are mostly noise"
        )
    if result.b_simple is not None and result.stderr is None:
        reasons.append(
            "it has no standard error (that needs 2 or more steps, each left-out average positive)"
        )
    return reasons


def readable(x: float) -> str:
    """A number for a sentence: whole from 1000 up (4096 -> "4096", where `:.3g` writes
    "4.1e+03"), else three significant digits (1.125 -> "1.12"); an exponent only outside
    [1e-4, 1e15)."""
    if not math.isfinite(x) or not 1e-4 <= abs(x) < 1e15:
        return f"{x:.3g}"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    places = 2 - math.floor(math.log10(abs(x)))
    text = f"{round(x, places):.{max(places, 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def efficiency(batch_size: int, noise_scale: float, stderr: float | None = None) -> BatchEfficiency:
    """Where `batch_size` stands against the critical batch `noise_scale` (B_noise, or
    B_simple as its estimate); `stderr`, the noise scale's standard error, only enters the
    text."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1; got {batch_size}")
    if not (math.isfinite(noise_scale) and noise_scale > 0):
        raise ValueError(f"the noise scale must be a positive number; got {noise_scale}")
    if stderr is not None and not (math.isfinite(stderr) and stderr >= 0):
        raise ValueError(f"the standard error must be a finite number >= 0; got {stderr}")
    B, n = float(batch_size), float(noise_scale)
    ratio = B / n
    steps, samples = 1 + n / B, 1 + B / n
    if not (math.isfinite(ratio) and math.isfinite(steps) and math.isfinite(samples)):
        raise ValueError(f"a noise scale of {noise_scale} is too small for a batch of {batch_size}")
    about = f"about {readable(n)}" + (f" +/- {readable(stderr)}" if stderr else "")
    head = (
        f"global batch {batch_size} is {readable(ratio)}x the critical batch ({about} samples): it "
        f"needs {readable(steps)}x the fewest possible optimizer steps and {readable(samples)}x "
        f"the fewest possible samples"
    )
    # At B = B_noise both ratios are 2.
    if ratio > NEAR_FACTOR:
        verdict = "above_critical"
        advice = (
            f"; past the critical batch more samples buy few steps: a global batch near "
            f"{readable(n)} would need about {readable(samples / 2)}x fewer samples for "
            f"{readable(2 / steps)}x the steps, or keep this one for wall-clock speed if "
            f"samples are cheap"
        )
    elif ratio < 1 / NEAR_FACTOR:
        verdict = "below_critical"
        advice = (
            f"; below the critical batch a bigger one cuts steps nearly in proportion: "
            f"a global batch of about {readable(n)} (more replicas or accumulation) would "
            f"need about {readable(steps / 2)}x fewer steps for {readable(2 / samples)}x the "
            f"samples"
        )
    else:
        verdict = "near_critical"
        advice = "; that is a good trade of steps against samples"
    return BatchEfficiency(
        batch_size=batch_size,
        gradient_noise_scale=n,
        gradient_noise_scale_stderr=None if stderr is None else float(stderr),
        critical_batch_size=n,
        batch_to_critical=ratio,
        steps_vs_min=steps,
        samples_vs_min=samples,
        step_efficiency=1 / steps,
        sample_efficiency=1 / samples,
        verdict=verdict,
        recommendation=head + advice,
    )
