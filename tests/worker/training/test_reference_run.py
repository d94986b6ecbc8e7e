"""The reference run's global batches against the samplers the runs use: torch's own
DataLoader over DistributedSampler for an even plan, the worker's ProportionalSampler (which
the python skeleton carries) for an uneven one, epoch by epoch."""

from __future__ import annotations

import pytest
import torch
from support.bodies import node_groups
from torch.utils.data import DataLoader, DistributedSampler

from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn
from app.worker.training.plan_steps import step_indices
from app.worker.training.reference_run import reference_run
from app.worker.training.samplers import ProportionalSampler

UNEVEN = {
    "topology": node_groups(("fast", 1, 2, 2.0), ("slow", 1, 1, 1.0)),
    "global_batch_size": 20,
    "gradient_accumulation_steps": 2,
    "dataset": {"num_samples": 53, "epochs": 2, "seed": 5},
}
EVEN = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 12,
    "micro_batch_size": 2,
    "dataset": {"num_samples": 37, "epochs": 2, "seed": 3},
}


def _plan(body: dict[str, object]):  # type: ignore[no-untyped-def]
    return plan(PlanRequestIn.model_validate(body).to_core())


def _replica_batches(loader: DataLoader[int], accumulation: int, steps: int) -> list[list[list[int]]]:
    batches = [b.tolist() for b in loader]
    return [batches[k * accumulation : (k + 1) * accumulation] for k in range(steps)]


@pytest.mark.parametrize("epoch", [0, 1])
def test_an_uneven_plans_steps_are_the_proportional_samplers(epoch: int) -> None:
    p = _plan(UNEVEN)
    micro = [g.micro_batch_size for g in p.replica_groups for _ in range(g.start, g.stop)]
    steps = p.sampler.optimizer_steps_per_epoch  # type: ignore[union-attr]
    ours = list(step_indices(p, 53, epoch))
    for rank in range(3):
        sampler = ProportionalSampler(53, micro, rank, seed=5)
        sampler.set_epoch(epoch)
        loader = DataLoader(range(53), batch_size=micro[rank], sampler=sampler)  # type: ignore[arg-type]
        assert [step[rank] for step in ours] == _replica_batches(loader, 2, steps)


@pytest.mark.parametrize("epoch", [0, 1])
def test_an_even_plans_steps_are_torchs_distributed_sampler_and_drop_the_leftover(epoch: int) -> None:
    p = _plan(EVEN)
    assert p.sampler is not None and p.sampler.leftover_micro_steps == 1  # 10 micro-steps, 3 a step
    ours = list(step_indices(p, 37, epoch))
    assert len(ours) == p.sampler.optimizer_steps_per_epoch == 3
    for rank in range(2):
        sampler = DistributedSampler(range(37), num_replicas=2, rank=rank, seed=3)  # type: ignore[arg-type]
        sampler.set_epoch(epoch)
        loader = DataLoader(range(37), batch_size=2, sampler=sampler)  # type: ignore[arg-type]
        assert [step[rank] for step in ours] == _replica_batches(loader, 3, 3)


def test_the_run_crosses_epochs_with_their_own_order_and_keeps_what_it_is_asked_to() -> None:
    p = _plan({**EVEN, "learning_rate": {"base_lr": 0.1, "warmup_steps": 2, "max_grad_norm": 0.5}})
    x = torch.randn(37, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    data = list(zip(x, x.sum(dim=1, keepdim=True), strict=True))
    model = torch.nn.Linear(3, 1, dtype=torch.float64)
    before = model.weight.detach().clone()
    run = reference_run(
        p, model, data, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), keep_params=True
    )
    assert [s.epoch for s in run.steps] == [0, 0, 0, 1, 1, 1]
    assert [s.step for s in run.steps] == list(range(6))
    assert torch.equal(model.weight, before)  # the run trains a copy
    assert run.steps[-1].params is not None
    assert torch.equal(run.steps[-1].params["weight"], run.final_params["weight"])
    assert list(step_indices(p, 37, 0)) != list(step_indices(p, 37, 1))  # set_epoch reshuffles
