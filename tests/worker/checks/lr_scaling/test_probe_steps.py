"""The probe's written-out training step against torch's own: its optimizer updates against
torch.optim (SGD with momentum, Nesterov and weight decay, Adam, AdamW) and the built-in
model's gradient by hand against autograd, over a run of real steps, within 1e-12 relative in
float64 (what the probe's curves are held to against the revision that used torch.optim)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from app.core.records.plan import LearningRatePlan
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
