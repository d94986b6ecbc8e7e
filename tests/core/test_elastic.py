"""Elastic plans against DeepSpeed's documented behaviour (its unit tests' numbers) and a
brute-force search over the same candidates."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors.domain import PlanError
from app.core.resume.elastic import HCN, ElasticRequest, candidate_batch_sizes, elastic_plan


def test_deepspeed_basic_10k() -> None:
    # deepspeed tests/unit/elasticity/test_elastic.py::test_basic_10k and test_valid_world_size
    result = elastic_plan(ElasticRequest(32, 1500, (8, 12, 16, 17), 10000))
    assert result.global_batch_size == 9792
    assert len(result.valid_gpus) == 23
    assert {c.gpus: c.micro_batch_size for c in result.counts}[64] == 17
    assert 128 not in result.valid_gpus


def test_deepspeed_proper_micro_batch_and_cap() -> None:
    # test_proper_mbsz: the largest micro-batch that divides the share; test_batch_size_within_max
    result = elastic_plan(ElasticRequest(1, 32, (1, 2, 3, 7), 32))
    assert {c.gpus: c.micro_batch_size for c in result.counts}[4] == 3
    assert 7 not in result.valid_gpus
    assert elastic_plan(ElasticRequest(1, 12, (8, 10, 12), 100)).global_batch_size <= 100


def _brute(
    micros: tuple[int, ...], cap: int, low: int, high: int, prefer_larger: bool
) -> tuple[int, list[int]]:
    best, best_gpus = 0, []
    for batch in candidate_batch_sizes(micros, cap):
        gpus = [n for n in range(low, high + 1) if any(batch % (m * n) == 0 for m in micros)]
        if len(gpus) > len(best_gpus) or (
            gpus and len(gpus) == len(best_gpus) and (batch > best if prefer_larger else batch < best)
        ):
            best, best_gpus = batch, gpus
    return best, best_gpus


@settings(max_examples=80, deadline=None)
@given(
    micros=st.lists(st.integers(1, 40), min_size=1, max_size=4).map(lambda v: tuple(sorted(set(v)))),
    cap=st.integers(40, 20000),
    low=st.integers(1, 20),
    width=st.integers(0, 200),
    prefer_larger=st.booleans(),
)
def test_matches_brute_force_and_every_count_divides(
    micros: tuple[int, ...], cap: int, low: int, width: int, prefer_larger: bool
) -> None:
    request = ElasticRequest(low, low + width, micros, cap, prefer_larger)
    batch, gpus = _brute(micros, cap, low, low + width, prefer_larger)
    if not gpus:
        with pytest.raises(PlanError):
            elastic_plan(request)
        return
    result = elastic_plan(request)
    assert (result.global_batch_size, list(result.valid_gpus)) == (batch, gpus)
    assert result.global_batch_size <= cap
    for c in result.counts:
        assert c.micro_batch_size * c.gradient_accumulation_steps * c.gpus == result.global_batch_size
        assert c.micro_batch_size == max(m for m in micros if batch % (m * c.gpus) == 0)


def test_candidates_are_hcn_multiples_of_each_base() -> None:
    candidates = candidate_batch_sizes((8, 12), 1000)
    assert math.lcm(8, 12) * 36 in candidates  # 24 x 36 = 864, the largest HCN multiple <= 1000
    assert all(any(c % h == 0 for h in HCN) for c in candidates)


def test_learning_rate_is_one_value_for_every_count() -> None:
    from app.core.records.plan_request import LearningRateSpec, LRRule

    result = elastic_plan(
        ElasticRequest(8, 64, (4, 8), 4096, learning_rate=LearningRateSpec(0.1, 256, LRRule.LINEAR))
    )
    assert result.learning_rate is not None
    assert result.learning_rate.lr == pytest.approx(0.1 * result.global_batch_size / 256)


def test_invalid_ranges_name_the_field() -> None:
    with pytest.raises(PlanError) as caught:
        elastic_plan(ElasticRequest(16, 8, (4,), 1024))
    assert caught.value.pointer == "/max_gpus"
    with pytest.raises(PlanError) as caught:
        elastic_plan(ElasticRequest(1, 8, (4, 2048), 1024))
    assert caught.value.pointer == "/micro_batch_sizes"
