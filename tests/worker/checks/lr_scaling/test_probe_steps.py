"""The probe's written-out training step against torch's own: its optimizer updates against
torch.optim (SGD with momentum, Nesterov and weight decay, Adam, AdamW) and the built-in
model's gradient by hand against autograd, over a run of real steps, within 1e-12 relative in
float64 (what the probe's curves are held to against the revision that used torch.optim)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from app.contract.kinds.lr_scaling import ProbeRunSpec
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import LearningRatePlan
from app.worker.checks.lr_scaling.fused import train_together
from app.worker.checks.lr_scaling.gradients import squared_norm_of, trainable
from app.worker.checks.lr_scaling.updates import Update
from app.worker.training.reference_run import build_optimizer
from app.worker.training.synthetic_model import half_squared_error
from app.worker.training.workload import SyntheticWorkload

SGD = LearningRatePlan(
    optimizer="sgd", rule="linear", requested_rule="linear", base_lr=0.05, base_batch_size=8,
    factor=1.0, lr=0.05, warmup_steps=0, warmup_start_lr=0.0,
)  # fmt: skip


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b, strict=True))


def _batches(work: SyntheticWorkload, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for j in range(steps):
        x, y = work.batch(range(8 * j, 8 * j + 8), torch.float64, torch.device("cpu"))
        out.append((x, y))
    return out


@pytest.mark.parametrize(
    "recipe",
    [
        SGD,
        dataclasses.replace(SGD, momentum=0.8, nesterov=True, weight_decay=1e-3),
        dataclasses.replace(SGD, optimizer="adam", betas=(0.9, 0.99), eps=1e-8, weight_decay=1e-3),
        dataclasses.replace(SGD, optimizer="adamw", betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
    ],
    ids=["sgd", "nesterov_decay", "adam_decay", "adamw"],
)
def test_a_run_by_hand_matches_torch_optim_and_autograd(recipe: LearningRatePlan) -> None:
    work = SyntheticWorkload(3)
    cpu = torch.device("cpu")
    theirs = work.module(torch.float64, cpu)
    optimizer = build_optimizer(recipe, theirs.parameters())
    mine = work.module(torch.float64, cpu)
    params, gradient, _ = trainable(work, mine)
    update = Update(recipe, params)
    assert gradient.__name__ == "by_hand"  # the built-in model's written-out backward
    for j, (x, y) in enumerate(_batches(work, 300)):
        lr = recipe.lr * (1 - j / 300)  # a moving lr, as a schedule's
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        half_squared_error(theirs(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        with torch.no_grad():
            update.step(gradient(x, y), lr)
    ours = [p.detach() for p in mine.parameters()]  # views of the one tensor the update stepped
    assert _relative(ours, [p.detach() for p in theirs.parameters()]) < 1e-12


def test_any_other_model_takes_autograd() -> None:
    work = SyntheticWorkload(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 4, dtype=torch.float64))
    _, gradient, _ = trainable(work, module)
    assert gradient.__name__ == "by_autograd"
    x, y = _batches(work, 1)[0]
    with torch.no_grad():  # as the run's loop calls it
        grads = gradient(x, y)
    half_squared_error(module(x), y).backward()  # type: ignore[no-untyped-call]
    assert _relative(list(grads), [p.grad for p in module.parameters() if p.grad is not None]) == 0


def test_the_noise_scales_squared_norm_by_hand_is_autograds() -> None:
    work = SyntheticWorkload(5)
    module = work.module(torch.float64, torch.device("cpu"))
    by_hand = squared_norm_of(work, module, trainable(work, module).gradient)
    by_autograd = squared_norm_of(work, module, None)
    for x, y in _batches(work, 3):
        assert by_hand(x, y) == pytest.approx(by_autograd(x, y), rel=1e-12)


@pytest.mark.parametrize(
    "recipe",
    [
        dataclasses.replace(SGD, momentum=0.9, max_grad_norm=0.05),
        dataclasses.replace(SGD, optimizer="adamw", betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
    ],
    ids=["sgd_clipped", "adamw"],
)
def test_rule_runs_trained_together_are_each_trained_alone(recipe: LearningRatePlan) -> None:
    """Three lrs from one initialisation on the same batches, one of them diverging: each run's
    curve trained together equals its curve trained alone (the probe's own step) to 1e-12."""
    work, cpu = SyntheticWorkload(7), torch.device("cpu")
    lrs = [0.02, 0.05, 1e200]  # the last diverges, clipped or not
    specs = [ProbeRunSpec(f"r{lr}", 8, dataclasses.replace(recipe, lr=lr, base_lr=lr)) for lr in lrs]
    batches = _batches(work, 120)
    held_out = work.batch(range(10_000, 10_064), torch.float64, cpu)
    points = (0, 240, 480, 960)
    together = train_together(
        specs, [work.module(torch.float64, cpu) for _ in specs], iter(batches), held_out, 960, 16, points
    )
    assert together[2][-1][1] is None and together[0][-1][1] is not None
    for spec, curve in zip(specs, together, strict=True):
        module = work.module(torch.float64, cpu)
        params, gradient, _ = trainable(work, module)
        update = Update(spec.recipe, params)
        with torch.no_grad():
            alone: list[tuple[int, float | None]] = [(0, float(work.loss(module, *held_out, "mean")))]
            for j, (x, y) in enumerate(batches):
                grads = gradient(x, y)
                if spec.recipe.max_grad_norm is not None:
                    total = torch.nn.utils.get_total_norm(list(grads), 2.0)
                    grads = [
                        g.mul(torch.clamp(spec.recipe.max_grad_norm / (total + 1e-6), max=1.0)) for g in grads
                    ]
                update.step(grads, lr_of(spec.recipe, (j * 8) // 16))
                if (j + 1) * 8 in points:
                    value = float(work.loss(module, *held_out, "mean"))
                    alone.append(((j + 1) * 8, value if math.isfinite(value) else None))
        assert [p for p, _ in curve] == [p for p, _ in alone]
        if spec.recipe.lr > 1:  # chaotic once it blows up: both must have diverged by the end
            assert curve[-1][1] is None and alone[-1][1] is None, (curve, alone)
            continue
        assert [a for _, a in curve] == pytest.approx([b for _, b in alone], rel=1e-12)
