"""Learning-rate scaling, warmup and the Adam adjustment, against the papers' numbers."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import examples, homogeneous

from app.core.errors.domain import InvalidValue
from app.core.planner import plan
from app.core.records.plan_request import (
    DatasetSpec,
    LearningRateSpec,
    LRRule,
    Optimizer,
    PlanRequest,
    Topology,
)


def lr_plan(global_batch: int, spec: LearningRateSpec, gpus: int = 16, dataset: DatasetSpec | None = None):
    result = plan(homogeneous(gpus, global_batch_size=global_batch, learning_rate=spec, dataset=dataset))
    assert result.learning_rate is not None
    return result, result.learning_rate


def test_goyal_resnet50_8192_on_256_gpus_gives_3_2() -> None:
    request = PlanRequest(
        topology=Topology.homogeneous(32, 8),
        global_batch_size=8192,
        learning_rate=LearningRateSpec(base_lr=0.1, base_batch_size=256, rule=LRRule.LINEAR),
    )
    lr = plan(request).learning_rate
    assert lr is not None
    assert lr.factor == 32.0
    assert lr.lr == pytest.approx(3.2, rel=1e-15)
    assert lr.warmup_start_lr == 0.1


@examples(100)
@given(
    global_batch=st.integers(1, 512).map(lambda k: 16 * k),
    base_batch=st.integers(1, 4096),
    base_lr=st.floats(1e-6, 10.0),
    rule=st.sampled_from([LRRule.LINEAR, LRRule.SQRT, LRRule.NONE]),
)
def test_rules_scale_with_the_global_batch(
    global_batch: int, base_batch: int, base_lr: float, rule: LRRule
) -> None:
    _, lr = lr_plan(global_batch, LearningRateSpec(base_lr=base_lr, base_batch_size=base_batch, rule=rule))
    kappa = global_batch / base_batch
    expected = {LRRule.LINEAR: kappa, LRRule.SQRT: math.sqrt(kappa), LRRule.NONE: 1.0}[rule]
    assert lr.factor == pytest.approx(expected, rel=1e-12)
    assert lr.lr == pytest.approx(base_lr * expected, rel=1e-12)
    assert lr.rule == rule.value and lr.requested_rule == rule.value
    assert lr.warmup_start_lr == base_lr
    assert lr.warmup_steps == 0


@pytest.mark.parametrize(
    ("optimizer", "rule"),
    [
        (Optimizer.SGD, LRRule.LINEAR),
        (Optimizer.LARS, LRRule.LINEAR),
        (Optimizer.ADAM, LRRule.SQRT),
        (Optimizer.ADAMW, LRRule.SQRT),
        (Optimizer.LAMB, LRRule.SQRT),
    ],
)
def test_auto_picks_the_rule_by_optimizer(optimizer: Optimizer, rule: LRRule) -> None:
    _, lr = lr_plan(
        1024, LearningRateSpec(base_lr=0.01, base_batch_size=256, rule=LRRule.AUTO, optimizer=optimizer)
    )
    assert lr.rule == rule.value and lr.requested_rule == "auto"
    assert lr.factor == pytest.approx(4.0 if rule is LRRule.LINEAR else 2.0)


@examples(80)
@given(
    per_replica=st.integers(1, 64),
    num_samples=st.integers(1, 200_000),
    warmup_epochs=st.one_of(
        st.integers(0, 10).map(float),
        st.sampled_from([0.1, 0.55, 1.1, 2.3, 1e-3, 7.7]),
        # Whole epochs up to and past 2**53, where a float stops being the integer written.
        st.integers(2**53 - 4, 2**53 + 4).map(float),
        st.integers(0, 2**60),  # the core takes a Python int as well (the CLI, bench_core)
        st.sampled_from([1e16, 1.2345678901234567e25, 3e300]),
    ),
)
def test_warmup_steps_are_the_ceiling_of_epochs_times_optimizer_steps(
    per_replica: int, num_samples: int, warmup_epochs: float
) -> None:
    result, lr = lr_plan(
        16 * per_replica,
        LearningRateSpec(base_lr=0.1, warmup_epochs=warmup_epochs),
        dataset=DatasetSpec(num_samples=num_samples),
    )
    assert result.sampler is not None
    steps = result.sampler.optimizer_steps_per_epoch
    # The decimal the user wrote, exactly: 0.1 epochs x 30 steps is 3 steps, not 4.
    assert lr.warmup_steps == math.ceil(Fraction(repr(warmup_epochs)) * steps)


def test_warmup_epochs_are_read_as_the_decimal_written() -> None:
    # 800 samples on 16 replicas, micro 1: 50 optimizer steps per epoch. 1.1 x 50 is 55 steps,
    # where the float product 55.00000000000001 would round up to 56.
    assert math.ceil(1.1 * 50) == 56
    spec = LearningRateSpec(base_lr=0.1, warmup_epochs=1.1)
    result, lr = lr_plan(16, spec, dataset=DatasetSpec(num_samples=800))
    assert result.sampler is not None and result.sampler.optimizer_steps_per_epoch == 50
    assert lr.warmup_steps == 55


def test_warmup_steps_given_directly_are_kept() -> None:
    _, lr = lr_plan(512, LearningRateSpec(base_lr=0.1, warmup_steps=2000))
    assert lr.warmup_steps == 2000


def test_warmup_epochs_without_a_dataset_is_rejected_at_the_field() -> None:
    with pytest.raises(InvalidValue) as caught:
        lr_plan(512, LearningRateSpec(base_lr=0.1, warmup_epochs=5))
    assert caught.value.pointer == "/learning_rate/warmup_epochs"


@examples(80)
@given(
    global_batch=st.integers(1, 256).map(lambda k: 16 * k),
    base_batch=st.sampled_from([16, 32, 64, 128, 256, 512]),
    beta1=st.floats(0.5, 0.99),
    beta2=st.floats(0.9, 0.9999),
    eps=st.floats(1e-12, 1e-4),
    optimizer=st.sampled_from([Optimizer.ADAM, Optimizer.ADAMW, Optimizer.LAMB]),
)
def test_malladi_adam_adjustment(
    global_batch: int, base_batch: int, beta1: float, beta2: float, eps: float, optimizer: Optimizer
) -> None:
    spec = LearningRateSpec(
        base_lr=1e-3,
        base_batch_size=base_batch,
        optimizer=optimizer,
        rule=LRRule.SQRT,
        betas=(beta1, beta2),
        eps=eps,
    )
    result, lr = lr_plan(global_batch, spec)
    kappa = global_batch / base_batch
    adam = lr.adam
    assert adam is not None
    assert adam.kappa == pytest.approx(kappa)
    assert adam.beta1 == pytest.approx(1 - kappa * (1 - beta1), rel=1e-12, abs=1e-15)
    assert adam.beta2 == pytest.approx(1 - kappa * (1 - beta2), rel=1e-12, abs=1e-15)
    assert adam.eps == pytest.approx(eps / math.sqrt(kappa), rel=1e-12)
    valid = kappa * (1 - beta1) < 1 and kappa * (1 - beta2) < 1
    assert adam.valid is valid
    assert any("kappa" in w for w in result.warnings) is not valid


def test_adam_defaults_and_no_adjustment_for_sgd_or_linear() -> None:
    _, adam_lr = lr_plan(1024, LearningRateSpec(base_lr=1e-3, optimizer=Optimizer.ADAM))
    assert adam_lr.adam is not None
    assert adam_lr.adam.beta1 == pytest.approx(1 - 4 * 0.1)
    assert adam_lr.adam.beta2 == pytest.approx(1 - 4 * 0.001)
    assert adam_lr.adam.eps == pytest.approx(1e-8 / 2)
    _, sgd_lr = lr_plan(1024, LearningRateSpec(base_lr=0.1, optimizer=Optimizer.SGD, rule=LRRule.SQRT))
    assert sgd_lr.adam is None
    result, linear_adam = lr_plan(
        1024, LearningRateSpec(base_lr=1e-3, optimizer=Optimizer.ADAM, rule=LRRule.LINEAR)
    )
    assert linear_adam.adam is None
    assert any("linear scaling" in w for w in result.warnings)


def test_adam_adjustment_past_its_range_is_flagged_invalid() -> None:
    # kappa = 16: 16 x (1 - 0.9) = 1.6 >= 1, so beta1 would be negative.
    result, lr = lr_plan(4096, LearningRateSpec(base_lr=1e-3, optimizer=Optimizer.ADAMW, base_batch_size=256))
    assert lr.adam is not None and lr.adam.valid is False
    assert lr.adam.beta1 < 0
    assert any("kappa" in w for w in result.warnings)
