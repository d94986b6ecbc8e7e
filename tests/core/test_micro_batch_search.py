"""The micro-batch finder's pure search order (app.core.split.micro_batch_search): doubling then
bisection against a linear scan, its refusals, the budget and the affine fit of the peaks."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from app.core.split.micro_batch_search import (
    SearchResult,
    Trial,
    affine_bytes_per_sample,
    budget_bytes,
    search_max_micro_batch,
)


def run_search(threshold: int, limit: int, start: int = 1) -> tuple[SearchResult, list[int]]:
    """Search a monotone `fits(b) = b <= threshold`, recording the sizes tried."""
    tried: list[int] = []

    def try_size(size: int) -> Trial:
        tried.append(size)
        return Trial(micro_batch_size=size, fits=size <= threshold, peak_bytes=size * 100)

    return search_max_micro_batch(try_size, limit=limit, start=start), tried


def brute_force(threshold: int, limit: int) -> int:
    return max((b for b in range(1, limit + 1) if b <= threshold), default=0)


@pytest.mark.parametrize("start", [1, 3, 8])
def test_search_matches_a_linear_scan_for_every_threshold_and_limit(start: int) -> None:
    for limit in range(start, 70):
        for threshold in range(limit + 2):
            result, tried = run_search(threshold, limit, start)
            assert result.max_micro_batch_size == brute_force(threshold, limit), (threshold, limit)
            assert len(tried) == len(set(tried)), tried
            assert all(1 <= size <= limit for size in tried)
            assert [t.micro_batch_size for t in result.trials] == tried
            assert result.hit_limit == (threshold >= limit)
            assert len(tried) <= 2 * math.ceil(math.log2(limit + 1)) + 2


def test_search_over_a_large_limit_stays_logarithmic() -> None:
    rng = random.Random(0)
    for threshold in [0, 1, 2, 1000, 65535, 65536, *rng.sample(range(1, 70000), 40)]:
        result, tried = run_search(threshold, 65536)
        assert result.max_micro_batch_size == min(threshold, 65536)
        assert len(tried) == len(set(tried)) <= 34


def test_search_doubles_then_clamps_to_the_limit() -> None:
    result, tried = run_search(threshold=10**9, limit=100)
    assert tried == [1, 2, 4, 8, 16, 32, 64, 100]
    assert result.hit_limit and result.max_micro_batch_size == 100


def test_search_then_bisects_between_the_last_fit_and_the_first_failure() -> None:
    _, tried = run_search(threshold=45, limit=1000)
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 44, 46, 45]


def test_nothing_fits_gives_zero_after_one_trial() -> None:
    result, tried = run_search(threshold=0, limit=64)
    assert (result.max_micro_batch_size, result.hit_limit, tried) == (0, False, [1])


def test_a_failing_start_searches_below_it() -> None:
    result, tried = run_search(threshold=5, limit=64, start=16)
    assert result.max_micro_batch_size == 5 and tried[0] == 16 and len(tried) == len(set(tried))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0}, "limit must be at least 1"),
        ({"limit": 8, "start": 0}, "start must be at least 1"),
        ({"limit": 8, "start": 9}, "must not exceed limit"),
        ({"limit": 8.0}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
    ],
)
def test_search_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    def never(size: int) -> Trial:
        raise AssertionError("no trial should run")

    with pytest.raises(ValueError, match=message):
        search_max_micro_batch(never, **kwargs)


def test_search_rejects_a_trial_for_another_size() -> None:
    with pytest.raises(ValueError, match="returned a trial for micro-batch 2"):
        search_max_micro_batch(lambda size: Trial(size + 1, True, None), limit=4)


def test_trial_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        Trial(0, True, None)
    with pytest.raises(ValueError, match="peak_bytes"):
        Trial(1, True, -1)


def test_budget_is_the_capacity_less_the_margin_rounded_down() -> None:
    assert budget_bytes(10, 0.1) == 9
    assert budget_bytes(1000, 0) == 1000
    assert budget_bytes(141_000_000_000, 0.1) == 126_900_000_000
    assert budget_bytes(7, 0.5) == 3
    assert budget_bytes(0, 0.2) == 0


@pytest.mark.parametrize(
    ("capacity", "margin"), [(100, 1.0), (100, -0.01), (100, math.nan), (-1, 0.1), (100.0, 0.1), (100, "0.1")]
)
def test_budget_rejects_bad_arguments(capacity: Any, margin: Any) -> None:
    with pytest.raises(ValueError):
        budget_bytes(capacity, margin)


def test_affine_fit_recovers_the_slope() -> None:
    assert affine_bytes_per_sample([(1, 1100), (2, 1200), (8, 1800)]) == pytest.approx(100)
    assert affine_bytes_per_sample([(4, 10), (4, 12)]) is None
    assert affine_bytes_per_sample([]) is None
