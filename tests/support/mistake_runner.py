"""The torchrun program of tests/worker/checks/run/test_run_mistakes.py: the plan's run with one known
mistake, made the literal way with torch's own pieces, one replica per process.

    torchrun --nproc-per-node DP mistake_runner.py MISTAKES RUN_PLAN.json STEPS OUT_DIR

MISTAKES is a comma-separated list, trained one after another in one process group.

A DataLoader over DistributedSampler (set_epoch each epoch, unless the mistake is
set_epoch_missing), DDP with no_sync() on all micro-batches but the last, the plan's loss scale,
torch's optimizer and a LambdaLR over the recipe's lr, clip_grad_norm_ on the all-reduced
gradient; then the mistake:

- scheduler_per_micro_batch: scheduler.step() after every micro-batch, outside the
  accumulation branch;
- scheduler_per_process: Accelerate's own prepared scheduler (accelerator.prepare), which steps
  the LambdaLR once per process at each optimizer step;
- set_epoch_missing: the sampler's set_epoch is never called;
- clip_before_all_reduce: every micro-batch under no_sync(), each process clips its own
  gradient, then the gradients are all-reduced and averaged by hand.

Rank 0 saves each optimizer step's lr and the parameters after it, to OUT_DIR/MISTAKE.pt.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from app.contract.kinds.run import planned_run
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import Plan
from app.core.request.parse import plan_request
from app.worker.training.samplers import IndexDataset
from app.worker.training.workload import SyntheticWorkload


def main() -> None:
    mistakes, plan_file, steps_text, out = sys.argv[1:5]
    dist.init_process_group("gloo")
    plan = planned_run(plan_request(json.loads(Path(plan_file).read_text())))
    for mistake in mistakes.split(","):
        record = train(mistake, plan, int(steps_text))
        if dist.get_rank() == 0:
            torch.save(record, Path(out) / f"{mistake}.pt")
    dist.barrier()  # no rank leaves while a peer's last collective may still be talking to it
    dist.destroy_process_group()
    # Every result is written: leave without the interpreter's teardown. Twice in CI (of ~8
    # runs, under the full suite's load) rank 0 aborted there, "terminate called without an
    # active exception" (a C++ thread of torch's still joinable when destroyed), 0.2 s after
    # writing its last file, and the fixture saw exit -6 though its work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(mistake: str, plan: Plan, steps: int) -> list[dict[str, object]]:
    """The plan's run of `steps` optimizer steps with `mistake` made; each step's lr and params."""
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe, sampler_plan = plan.learning_rate, plan.sampler
    assert recipe is not None and sampler_plan is not None and plan.data_parallel_size == world
    n = sampler_plan.total_size - sampler_plan.padded_samples + sampler_plan.dropped_samples
    g, micro = plan.gradient_accumulation_steps, plan.replica_groups[0].micro_batch_size
    scale = plan.replica_groups[0].loss_scale
    assert scale is not None
    workload = SyntheticWorkload(0)
    cpu = torch.device("cpu")
    module = workload.module(torch.float64, cpu)
    model = DistributedDataParallel(module)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(
        module.parameters(),
        lr=recipe.lr,
        momentum=recipe.momentum or 0.0,
        nesterov=recipe.nesterov,
        weight_decay=recipe.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_of(recipe, s) / recipe.lr)
    if mistake == "scheduler_per_process":
        from accelerate import Accelerator

        optimizer, scheduler = Accelerator(cpu=True).prepare(optimizer, scheduler)
    sampler = DistributedSampler(
        IndexDataset(n), num_replicas=world, rank=rank, shuffle=sampler_plan.shuffle, seed=sampler_plan.seed
    )
    loader = DataLoader(IndexDataset(n), batch_size=micro, sampler=sampler)
    record: list[dict[str, object]] = []
    epoch = 0
    while len(record) < steps:
        if mistake != "set_epoch_missing":
            sampler.set_epoch(epoch)
        batches = list(loader)[: sampler_plan.optimizer_steps_per_epoch * g]  # the leftover dropped
        for i, batch in enumerate(batches):
            last = (i + 1) % g == 0
            sync = last and mistake != "clip_before_all_reduce"
            x, y = workload.batch(batch.tolist(), torch.float64, cpu)
            with nullcontext() if sync else model.no_sync():
                (workload.loss(model, x, y, plan.loss_reduction) * scale).backward()
            if last:
                if mistake == "clip_before_all_reduce":
                    torch.nn.utils.clip_grad_norm_(module.parameters(), recipe.max_grad_norm or float("inf"))
                    for p in module.parameters():
                        dist.all_reduce(p.grad)
                        p.grad /= world
                elif recipe.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(module.parameters(), recipe.max_grad_norm)
                lr = optimizer.param_groups[0]["lr"]
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                params = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()
                record.append({"lr": lr, "params": params})
                if mistake != "scheduler_per_micro_batch":
                    scheduler.step()
            if mistake == "scheduler_per_micro_batch":
                scheduler.step()
            if len(record) == steps:
                break
        epoch += 1
    return record


if __name__ == "__main__":
    main()
