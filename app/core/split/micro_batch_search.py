"""The search for the largest micro-batch that fits in one device's memory.

Growth by doubling, then a binary search between the last size that fit and the first that
did not (Lightning's BatchSizeFinder calls the two phases `power` and `binsearch`). The
caller then reaches its global batch through gradient accumulation rather than shrinking it
until it fits. Pure: `try_size` does the measuring; here is only the order of the trials.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from fractions import Fraction

from app.core.records.record import record


@record
class Trial:
    """One attempt: whether `micro_batch_size` fit, its peak memory, and the error if it failed.

    `peak_bytes` of a failed trial is the peak reached before it stopped, a lower bound.
    """

    micro_batch_size: int
    fits: bool
    peak_bytes: int | None
    error: str | None = None

    def __post_init__(self) -> None:
        _require_int("micro_batch_size", self.micro_batch_size, minimum=1)
        if self.peak_bytes is not None:
            _require_int("peak_bytes", self.peak_bytes, minimum=0)


@record
class SearchResult:
    max_micro_batch_size: int  # 0 when even 1 does not fit
    trials: tuple[Trial, ...]  # in the order they ran
    hit_limit: bool  # the upper bound fit, so the real maximum may be larger


def search_max_micro_batch(try_size: Callable[[int], Trial], *, limit: int, start: int = 1) -> SearchResult:
    """The largest size in [1, limit] for which `try_size` fits, assuming fits(b) ⇒ fits(b − 1).

    Tries start, 2·start, 4·start, … (the last one clamped to `limit`) until one does not fit,
    then halves the gap between the largest size that fit and the smallest that did not.
    When `start` itself does not fit the binary search runs over [1, start). No size is tried
    twice, so at most about 2·log2(limit) trials run.
    """
    _require_int("limit", limit, minimum=1)
    _require_int("start", start, minimum=1)
    if start > limit:
        raise ValueError(f"start ({start}) must not exceed limit ({limit})")

    trials: list[Trial] = []
    tried: set[int] = set()

    def attempt(size: int) -> bool:
        if size in tried:  # the bisection invariant rules this out; a loud guard is cheap
            raise AssertionError(f"micro-batch {size} would be tried twice")
        tried.add(size)
        trial = try_size(size)
        if not isinstance(trial, Trial):
            raise TypeError(f"try_size({size}) returned {type(trial).__name__}, not a Trial")
        if trial.micro_batch_size != size:
            raise ValueError(f"try_size({size}) returned a trial for micro-batch {trial.micro_batch_size}")
        trials.append(trial)
        return trial.fits

    largest_fit = 0  # 0: nothing known to fit yet
    smallest_fail: int | None = None
    size = start
    while True:
        if not attempt(size):
            smallest_fail = size
            break
        largest_fit = size
        if size == limit:
            break
        size = min(2 * size, limit)

    if smallest_fail is not None:
        while smallest_fail - largest_fit > 1:
            middle = (largest_fit + smallest_fail) // 2
            if attempt(middle):
                largest_fit = middle
            else:
                smallest_fail = middle

    return SearchResult(
        max_micro_batch_size=largest_fit, trials=tuple(trials), hit_limit=largest_fit == limit
    )


def budget_bytes(capacity_bytes: int, safety_margin: float) -> int:
    """floor(capacity × (1 − margin)): the peak a micro-batch may reach and still count as fitting.

    The margin is read as the decimal it was written as (0.1 is one tenth), so that
    `budget_bytes(10, 0.1)` is 9, not the 8 that the binary value of 0.1 would give exactly.
    """
    _require_int("capacity_bytes", capacity_bytes, minimum=0)
    if isinstance(safety_margin, bool) or not isinstance(safety_margin, int | float):
        raise ValueError(f"safety_margin must be a number in [0, 1), not {safety_margin!r}")
    if not (math.isfinite(safety_margin) and 0 <= safety_margin < 1):
        raise ValueError(f"safety_margin must be in [0, 1), got {safety_margin!r}")
    margin = Fraction(repr(float(safety_margin)))
    return math.floor(capacity_bytes * (1 - margin))


def affine_bytes_per_sample(points: Iterable[tuple[int, int]]) -> float | None:
    """Slope of the least-squares line through (micro_batch_size, peak_bytes) points.

    Peak memory is close to affine in the micro-batch (weights, grads and optimizer state
    plus activations per sample), so the slope estimates the bytes one more sample costs.
    None with fewer than two distinct sizes.
    """
    pairs = [(Fraction(b), Fraction(p)) for b, p in points]
    if len({b for b, _ in pairs}) < 2:
        return None
    n = len(pairs)
    mean_b = sum((b for b, _ in pairs), Fraction(0)) / n
    mean_p = sum((p for _, p in pairs), Fraction(0)) / n
    covariance = sum(((b - mean_b) * (p - mean_p) for b, p in pairs), Fraction(0))
    variance = sum(((b - mean_b) ** 2 for b, _ in pairs), Fraction(0))
    return float(covariance / variance)


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
