"""The ramp-up against megatron-core's own RampupBatchsizeNumMicroBatchesCalculator, on many
seeded ramps and on the stage boundaries where float arithmetic decides (CONTRACT.md,
"Schedules")."""

from __future__ import annotations

import random
from types import ModuleType

import pytest
from megatron_calculator import calculator_module

from app.core.learning_rate.schedule import schedule
from app.core.planner import plan
from app.core.records.schedule import Rampup, ScheduleSpec
from app.schemas.plan_requests import PlanRequestIn

MEGATRON = calculator_module()
pytestmark = pytest.mark.skipif(MEGATRON is None, reason="megatron-core is not installed (consumers group)")


def _megatron_run(megatron: ModuleType, rampup: Rampup, target: int, micro: int, dp: int, steps: int):  # type: ignore[no-untyped-def]
    """(global batch, micro-batches) per step, as Megatron's training loop updates them."""
    calc = megatron.RampupBatchsizeNumMicroBatchesCalculator(
        target,
        micro,
        dp,
        False,
        1,
        *(rampup.start_batch_size, rampup.batch_size_increment),
        rampup.rampup_samples,
    )
    consumed, out = 0, []
    for _ in range(steps):
        calc.update(consumed, True)
        out.append((calc.get_current_global_batch_size(), calc.get()))
        consumed += calc.get_current_global_batch_size()
    return out


def _ours(rampup: Rampup, target: int, micro: int, dp: int, steps: int) -> list[tuple[int, int]]:
    body = {
        "topology": {"num_nodes": 1, "gpus_per_node": dp},
        "global_batch_size": target,
        "micro_batch_size": micro,
    }
    p = plan(PlanRequestIn.model_validate(body).to_core())
    result = schedule(p, ScheduleSpec(train_steps=steps, rampup=rampup, max_points=steps))
    assert not result.downsampled
    return [(pt.global_batch_size, pt.gradient_accumulation_steps) for pt in result.points]


def _random_ramp(rng: random.Random) -> tuple[Rampup, int, int, int]:
    micro, dp = rng.randint(1, 3), rng.randint(1, 4)
    unit = micro * dp
    start, increment, increments = rng.randint(1, 6) * unit, rng.randint(1, 4) * unit, rng.randint(1, 60)
    target = start + increment * increments
    # Ramps of a few dozen steps: short enough to replay, long enough to cross every stage.
    ramp_samples = rng.randint(1, target * rng.randint(1, 12))
    return Rampup(start, increment, ramp_samples), target, micro, dp


def test_the_issues_boundary_case_moves_where_megatron_moves() -> None:
    assert MEGATRON is not None
    rampup = Rampup(8, 2, 46)  # data parallel 2, micro 1, target 186
    ours = _ours(rampup, 186, 1, 2, 6)
    assert ours == _megatron_run(MEGATRON, rampup, 186, 1, 2, 6)
    assert ours[2][0] == 186  # 46 samples consumed at step 2: Megatron is at the target


@pytest.mark.slow
def test_a_thousand_seeded_ramps_match_megatron_step_for_step() -> None:
    assert MEGATRON is not None
    rng = random.Random(16)
    for _ in range(1000):
        rampup, target, micro, dp = _random_ramp(rng)
        steps = rampup.rampup_samples // rampup.start_batch_size + 3  # past the ramp's end
        expected = _megatron_run(MEGATRON, rampup, target, micro, dp, steps)
        assert _ours(rampup, target, micro, dp, steps) == expected, (rampup, target, micro, dp)
