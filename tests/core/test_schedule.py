"""Schedules against a step-by-step replay of Megatron's ramp-up rule and the lr formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors.domain import PlanError
from app.core.learning_rate.schedule import schedule
from app.core.planner import plan
from app.core.records.plan_request import Decay
from app.core.records.schedule import Rampup, ScheduleSpec
from app.schemas.plan_requests import PlanRequestIn


def _plan(global_batch: int, micro: int, gpus: int = 4, **extra: object):  # type: ignore[no-untyped-def]
    body = {
        "topology": {"num_nodes": 1, "gpus_per_node": gpus},
        "global_batch_size": global_batch,
        "micro_batch_size": micro,
        **extra,
    }
    return plan(PlanRequestIn.model_validate(body).to_core())


def _megatron_batches(start: int, increment: int, ramp_samples: int, target: int, steps: int) -> list[int]:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator.update, replayed each step: the
    batch is start + floor(consumed / (ramp_samples / increments)) x increment, capped."""
    increments = (target - start) // increment
    per_increment = ramp_samples / increments
    consumed, out = 0, []
    for _ in range(steps):
        if consumed > ramp_samples:
            batch = target
        else:
            batch = min(start + int(consumed / per_increment) * increment, target)
        out.append(batch)
        consumed += batch
    return out


@settings(max_examples=60, deadline=None)
@given(
    start_units=st.integers(1, 5),
    inc_units=st.integers(1, 3),
    increments=st.integers(1, 6),
    ramp_samples=st.integers(1, 5000),
    steps=st.integers(1, 300),
)
def test_rampup_matches_megatrons_rule_step_by_step(
    start_units: int, inc_units: int, increments: int, ramp_samples: int, steps: int
) -> None:
    unit = 8  # micro 2 x 4 replicas
    target = (start_units + inc_units * increments) * unit
    p = _plan(target, 2)
    rampup = Rampup(start_units * unit, inc_units * unit, ramp_samples)
    result = schedule(p, ScheduleSpec(train_steps=steps, rampup=rampup, max_points=1000))
    assert [pt.global_batch_size for pt in result.points] == _megatron_batches(
        rampup.start_batch_size, rampup.batch_size_increment, ramp_samples, target, steps
    )
    for pt in result.points:
        assert pt.global_batch_size == 2 * pt.gradient_accumulation_steps * 4  # micro x accum x dp
    assert result.train_samples == sum(pt.global_batch_size for pt in result.points)


def test_lr_warms_up_linearly_then_decays_to_min_lr() -> None:
    p = _plan(64, 4, learning_rate={"base_lr": 0.1, "base_batch_size": 32, "warmup_steps": 10})
    lr = p.learning_rate
    assert lr is not None and lr.lr == pytest.approx(0.2)
    for decay in (Decay.COSINE, Decay.LINEAR, Decay.CONSTANT):  # step decay needs milestones
        points = schedule(p, ScheduleSpec(train_steps=101, decay=decay, min_lr=0.01)).points
        assert points[0].lr == lr.warmup_start_lr
        assert points[5].lr == pytest.approx(0.1 + 0.1 * 5 / 10)
        assert points[10].lr == pytest.approx(0.2)
        last = {Decay.COSINE: 0.01, Decay.LINEAR: 0.01, Decay.CONSTANT: 0.2}[decay]
        assert points[-1].lr == pytest.approx(last)
        if decay is Decay.COSINE:
            assert points[55].lr == pytest.approx(0.01 + 0.19 * 0.5 * (1 + math.cos(math.pi * 45 / 90)))


def test_series_is_bounded_and_keeps_the_batch_change() -> None:
    p = _plan(1024, 8, learning_rate={"base_lr": 0.1, "warmup_steps": 1000})
    result = schedule(p, ScheduleSpec(train_steps=10**12, rampup=Rampup(32, 32, 10**9), max_points=300))
    assert result.downsampled and len(result.points) <= 300
    steps = [pt.step for pt in result.points]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 10**12 - 1
    first_full = next(s.first_step for s in result.stages if s.global_batch_size == 1024)
    assert first_full in steps and first_full - 1 in steps


def test_rampup_batches_must_split_into_micro_batches() -> None:
    p = _plan(64, 2)  # unit 8
    with pytest.raises(PlanError) as caught:
        schedule(p, ScheduleSpec(train_steps=10, rampup=Rampup(12, 8, 100)))
    assert caught.value.pointer == "/rampup/start_batch_size"
    assert caught.value.suggestions == {"rampup.start_batch_size": [8, 16]}
    with pytest.raises(PlanError, match="whole number of increments"):
        schedule(p, ScheduleSpec(train_steps=10, rampup=Rampup(8, 48, 100)))


def test_run_length_defaults_to_the_plans_epochs() -> None:
    p = _plan(64, 4, dataset={"num_samples": 6400, "epochs": 3})
    assert schedule(p, ScheduleSpec()).train_steps == 300
    with pytest.raises(PlanError, match="train_steps"):
        schedule(_plan(64, 4), ScheduleSpec())
