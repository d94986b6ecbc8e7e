#!/usr/bin/env python3
"""DDP training loop for a batchplan plan.

batchplan: 8 GPUs, data-parallel size 8
global batch 256 = micro-batch 8 x accumulation 4 x 8 replicas
learning rate 0.001 (none rule from 0.001 per 256), warmup 20 steps from 0.0
lr schedule: linear warmup from 0.0 to 0.001 over 20 optimizer steps, then cosine decay from 0.001 to 0.0001 at the last step (499)
optimizer adamw, betas (0.9, 0.999), eps 1e-08, weight decay 0.05, gradient clipping at global norm 1.0
warning: the last micro-batch of each epoch holds 2 of 8 samples per replica, so its samples weigh more in that step's gradient
warning: an epoch ends mid-accumulation: its last 2 of 782 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 195 counts whole steps): the plan drops them, and every export skips them

Launch one process per GPU with torchrun (see the torchrun export for multi-node), e.g.
    torchrun --nproc-per-node 4 train.py
Replace build_dataset() and build_model(). To try the loop first on CPU with a toy model and
data set (gloo backend): BATCHPLAN_TOY=1 torchrun --nproc-per-node 8 train.py --max-steps 2
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

# ---- the plan: change it by planning again, not by hand --------------------------------
DATA_PARALLEL_SIZE = 8  # processes; the loop refuses to run with any other number
GLOBAL_BATCH_SIZE = 256
GRADIENT_ACCUMULATION_STEPS = 4
# (first rank, stop rank, micro-batch size, loss scale) for data-parallel ranks [first, stop)
REPLICA_GROUPS = [(0, 8, 8, 0.25)]
LOSS_REDUCTION = "mean"
# "token": each valid token of a step weighs the same (see with_loss_scales); "sample": loss scales.
LOSS_NORMALIZATION = "sample"
IGNORE_INDEX = -100  # labels the token loss skips (padding), as torch's cross_entropy does
SHUFFLE, SEED, DROP_LAST = True, 0, False
EPOCHS = 3  # None: as many as TRAIN_STEPS takes
TRAIN_STEPS = 500  # the run's optimizer steps; None: every step of EPOCHS
LR = 0.001  # the peak; planned_lr(step) is every step's
MAX_GRAD_NORM = 1.0  # clip the all-reduced gradient to this global norm; None: no clipping


# The lr of every optimizer step: batchplan's own function (app.core.lr_schedule), so this
# file and the plan's schedule agree step for step.
def lr_at(
    step: int,
    *,
    start: float,
    peak: float,
    warmup: int,
    decay: str = "constant",
    floor: float = 0.0,
    last_step: int | None = None,
    milestones: tuple[int, ...] = (),
    gamma: float = 0.1,
) -> float:
    """The lr of optimizer step `step` (counted from 0).

    Linear warmup from `start` (at step 0) to `peak` (at step `warmup`), then `decay`:
    "constant" stays at `peak`; "linear" and "cosine" reach `floor` at `last_step` (the run's
    last optimizer step) and stay there; "step" multiplies `peak` by `gamma` at each milestone
    step reached (Goyal et al. 2017: x0.1 at epochs 30, 60 and 80).
    """
    if step < warmup:
        return start + (peak - start) * step / warmup
    if decay == "step":
        return peak * gamma ** sum(1 for m in milestones if step >= m)
    if decay == "constant" or last_step is None or last_step <= warmup or step == warmup:
        return peak
    # Written from the floor, so that the last step gives min_lr exactly.
    progress = min((step - warmup) / (last_step - warmup), 1.0)
    if decay == "linear":
        return floor + (peak - floor) * (1 - progress)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def planned_lr(step: int) -> float:
    """The plan's lr at optimizer step `step` (from 0): linear warmup from 0.0 to 0.001 over 20
    optimizer steps, then cosine decay from 0.001 to 0.0001 at the last step (499).
    """
    return lr_at(step, start=0.0, peak=0.001, warmup=20, decay="cosine", floor=0.0001, last_step=499)


TOY = os.environ.get("BATCHPLAN_TOY") == "1"


def build_dataset() -> Dataset:
    if TOY and LOSS_NORMALIZATION == "token":
        # Token sequences of 8 with 1 to 8 valid tokens; the rest is padding the loss ignores.
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(1, 16, (4 * GLOBAL_BATCH_SIZE, 8), generator=generator)
        lengths = torch.randint(1, 9, (len(ids), 1), generator=generator)
        labels = torch.where(torch.arange(8) < lengths, ids.roll(-1, dims=1), IGNORE_INDEX)
        return TensorDataset(ids, labels)
    if TOY:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4 * GLOBAL_BATCH_SIZE, 8, generator=generator)
        y = x @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(len(x), 1, generator=generator)
        return TensorDataset(x, y)
    raise NotImplementedError("build_dataset(): return your training Dataset (or set BATCHPLAN_TOY=1)")


def build_model() -> nn.Module:
    if TOY and LOSS_NORMALIZATION == "token":
        return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    if TOY:
        return nn.Linear(8, 1)
    raise NotImplementedError("build_model(): return your model (or set BATCHPLAN_TOY=1)")


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if LOSS_NORMALIZATION == "token":
        # Summed over valid tokens: with_loss_scales divides by the step's global count.
        return nn.functional.cross_entropy(
            output.flatten(0, -2), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    # The plan's loss scales assume this reduction.
    return nn.functional.mse_loss(output, target, reduction=LOSS_REDUCTION)


def replica_settings(rank: int) -> tuple[int, float]:
    for first, stop, micro, scale in REPLICA_GROUPS:
        if first <= rank < stop:
            return micro, scale
    raise ValueError(f"rank {rank} is in no replica group")


def with_loss_scales(loader, loss_scale: float, device: torch.device):
    """(inputs, targets, scale) per micro-batch. Under token normalisation a step's scale is
    DATA_PARALLEL_SIZE / N, N its valid tokens over all micro-batches and ranks (an all-reduce
    of the counts, as torchtitan does): DDP's mean over ranks then weighs every token 1/N.
    A mean per micro-batch or per rank would weigh tokens unequally where lengths differ."""
    if LOSS_NORMALIZATION != "token":
        for inputs, targets in loader:
            yield inputs, targets, loss_scale
        return
    step: list = []
    for batch in loader:
        step.append(batch)
        if len(step) < GRADIENT_ACCUMULATION_STEPS:
            continue
        valid = sum((targets != IGNORE_INDEX).sum() for _, targets in step).to(device)
        dist.all_reduce(valid)
        for inputs, targets in step:
            yield inputs, targets, DATA_PARALLEL_SIZE / valid.item()
        step = []


def make_sampler(dataset: Dataset, rank: int):
    return DistributedSampler(
        dataset, num_replicas=DATA_PARALLEL_SIZE, rank=rank, shuffle=SHUFFLE, seed=SEED,
        drop_last=DROP_LAST,
    )


def check_launch_env(micro_batch_size: int) -> None:
    """The launch script (torchrun, slurm, kubernetes exports) exports the plan's batch sizes: a
    launch script from another plan would start a batch this loop's loss scales do not fit."""
    planned = {"GLOBAL_BATCH_SIZE": GLOBAL_BATCH_SIZE, "MICRO_BATCH_SIZE": micro_batch_size,
               "GRADIENT_ACCUMULATION_STEPS": GRADIENT_ACCUMULATION_STEPS}
    for name, value in planned.items():
        if os.environ.get(name, str(value)) != str(value):
            raise SystemExit(f"the launch script sets {name}={os.environ[name]}, this script's plan has "
                             f"{value}: export both from the same plan")


def build_optimizer(params) -> torch.optim.Optimizer:
    """optimizer adamw, betas (0.9, 0.999), eps 1e-08, weight decay 0.05, gradient clipping at global norm 1.0; weight decay 0.05 on every parameter, decoupled (AdamW)"""
    return torch.optim.AdamW(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=TRAIN_STEPS or 0,
                        help="stop after this many optimizer steps")
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != DATA_PARALLEL_SIZE:
        raise SystemExit(
            f"this plan is for {DATA_PARALLEL_SIZE} processes, not {world}: the global batch and the "
            f"loss scales depend on it; plan again for {world}"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    micro_batch_size, loss_scale = replica_settings(rank)
    check_launch_env(micro_batch_size)

    torch.manual_seed(SEED)  # DDP also broadcasts rank 0's weights at construction
    model = DDP(build_model().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    dataset = build_dataset()
    sampler = make_sampler(dataset, rank)
    # The sampler owns drop_last; the DataLoader keeps every index it is given.
    loader = DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, drop_last=False)
    optimizer = build_optimizer(model.parameters())
    # Stepped once per optimizer step: planned_lr(step) is the lr of step `step`.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / 0.001)

    step, seen = 0, []  # seen: the size of every micro-batch this rank trained on
    for epoch in range(args.epochs) if args.epochs else itertools.count():
        sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first order
        optimizer.zero_grad(set_to_none=True)
        # Micro-batches past the last whole optimizer step are skipped: under no_sync their
        # gradients would stay local and leak, unscaled, into the next epoch's first step.
        usable = len(loader) // GRADIENT_ACCUMULATION_STEPS * GRADIENT_ACCUMULATION_STEPS
        for i, (inputs, targets, scale) in enumerate(with_loss_scales(loader, loss_scale, device)):
            if i >= usable:
                break
            inputs, targets = inputs.to(device), targets.to(device)
            seen.append(len(inputs))
            sync = (i + 1) % GRADIENT_ACCUMULATION_STEPS == 0
            # Only the last micro-batch of a step all-reduces; the others accumulate locally.
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = loss_fn(model(inputs), targets)
                # loss_scale makes the accumulated, DDP-averaged gradient that of the mean loss
                # over the global batch (1 / accumulation on an even split).
                (loss * scale).backward()
            if not sync:
                continue
            if MAX_GRAD_NORM is not None:
                # After the all-reduce (this backward synced): one global norm over the mean
                # gradient, as a single process would clip it. Clipping each replica's local
                # gradient, or each micro-batch's, trains a different run.
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and (step == 1 or step % args.log_every == 0):
                print(f"epoch {epoch} step {step} loss {loss.item():.6g} lr {scheduler.get_last_lr()[0]:.6g}",
                      flush=True)
            if args.max_steps and step >= args.max_steps:
                break
        if args.max_steps and step >= args.max_steps:
            break
    if rank == 0:
        print(f"done: {step} optimizer steps", flush=True)
    print(f"rank {rank}/{world}: {step} optimizer steps, {len(seen)} micro-batches of sizes "
          f"{sorted(set(seen))}, accumulation {GRADIENT_ACCUMULATION_STEPS}", flush=True)
    # DDP's reducer holds the process group and its last work objects; left to interpreter
    # shutdown, gloo's threads free tensors after Python is gone and the rank aborts with
    # "terminate called without an active exception". Free them while Python is alive (DDP's
    # hooks form reference cycles, hence the collect), then let every rank arrive before any
    # tears the group down.
    del model, optimizer, scheduler, loader, sampler
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
