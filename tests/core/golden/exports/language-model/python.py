#!/usr/bin/env python3
"""Training loop on a device mesh for a batchplan plan.

batchplan: 32 GPUs, data-parallel size 16 (model-parallel 2)
global batch 1024 = micro-batch 2 x accumulation 32 x 16 replicas
learning rate 0.0006 (sqrt rule from 0.0003 per 1048576 tokens), warmup 99 steps from 6e-06
lr schedule: linear warmup from 6e-06 to 0.0006 over 99 optimizer steps, then constant 0.0006
optimizer adamw, betas (0.6000000000000001, 0.996), eps 5e-09, no weight decay, no gradient clipping
warning: an epoch ends mid-accumulation: its last 4 of 62500 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 1953 counts whole steps): the plan drops them, and every export skips them

Launch one process per GPU with torchrun, e.g.
    torchrun --nproc-per-node 8 train.py
Replace build_dataset() and build_model() (and the tensor-parallel plan in parallelize()). To try
the loop first on CPU with a toy model and data set (gloo):
    BATCHPLAN_TOY=1 torchrun --nproc-per-node 32 train.py --max-steps 2
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

# ---- the plan: change it by planning again, not by hand --------------------------------
WORLD_SIZE = 32
MESH_DIM_NAMES = ("dp_replicate", "tp")  # torchtitan's order: pp, dp_replicate, dp_shard, cp, tp
MESH_SHAPE = (16, 2)
DATA_PARALLEL_SIZE = 16  # the sampler's num_replicas: dp_replicate x dp_shard, never the world
DATA_PARALLEL_SHARD = 1  # 1: DDP, DATA_PARALLEL_SIZE: FSDP, else HSDP
GLOBAL_BATCH_SIZE = 1024
MICRO_BATCH_SIZE = 2
GRADIENT_ACCUMULATION_STEPS = 32
LOSS_SCALE = None
LOSS_REDUCTION = "mean"
SHUFFLE, SEED, DROP_LAST = True, 0, False
EPOCHS = 1
MAX_GRAD_NORM = None  # clip the reduced gradient to this global norm; None: no clipping


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
    """The plan's lr at optimizer step `step` (from 0): linear warmup from 6e-06 to 0.0006 over
    99 optimizer steps, then constant 0.0006.
    """
    return lr_at(step, start=6e-06, peak=0.0006, warmup=99)


TOY = os.environ.get("BATCHPLAN_TOY") == "1"  # a toy model and data set, to try the loop on CPU


def build_dataset() -> Dataset:
    """Your training Dataset; the toy's targets are a smooth function of 8 features."""
    if not TOY:
        raise NotImplementedError("build_dataset(): return your Dataset (or set BATCHPLAN_TOY=1)")
    features = torch.randn(4 * GLOBAL_BATCH_SIZE, 8, generator=torch.Generator().manual_seed(SEED))
    return TensorDataset(features, torch.tanh(features.sum(dim=1, keepdim=True)))


def build_model() -> nn.Module:
    """Your model; parallelize() below names the toy's linear pair "0" and "2"."""
    if not TOY:
        raise NotImplementedError("build_model(): return your model (or set BATCHPLAN_TOY=1)")
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def parallelize(model: nn.Module, mesh) -> nn.Module:
    """Tensor parallel on mesh["tp"] (the toy's linear pair: column- then row-wise; give your
    model's own plan), then fully_shard over the data-parallel dimensions."""
    if "tp" in MESH_DIM_NAMES:
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if DATA_PARALLEL_SIZE > 1:
        # FSDP shards over dp_shard; HSDP (and DDP's arithmetic, with shards of one rank)
        # replicates over dp_replicate as well.
        dims = ("dp_shard",) if DATA_PARALLEL_SHARD == DATA_PARALLEL_SIZE else ("dp_replicate", "dp_shard")
        fully_shard(model, mesh=mesh[dims] if len(dims) > 1 else mesh[dims[0]])
    return model


def build_mesh(device_type: str):
    """The plan's mesh; DDP beside tensor parallel keeps a dp_shard dimension of size 1 for fully_shard."""
    names, shape = list(MESH_DIM_NAMES), list(MESH_SHAPE)
    if DATA_PARALLEL_SIZE > 1 and "dp_shard" not in names:
        at = names.index("dp_replicate") + 1
        names.insert(at, "dp_shard")
        shape.insert(at, 1)
    return init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))


def data_parallel_rank(mesh) -> int:
    """This rank's coordinate in dp_replicate x dp_shard: tensor peers share it, and the data."""
    names = mesh.mesh_dim_names
    replicate = mesh["dp_replicate"].get_local_rank() if "dp_replicate" in names else 0
    shard = mesh["dp_shard"].get_local_rank() if "dp_shard" in names else 0
    return replicate * DATA_PARALLEL_SHARD + shard


def optimizer_steps(loader, sampler, epochs):
    """(epoch, the micro-batches of one optimizer step), epoch after epoch; a partial last
    step is dropped, or its gradients would leak into the next epoch's first step."""
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first order
        step = []
        for batch in loader:
            step.append(batch)
            if len(step) == GRADIENT_ACCUMULATION_STEPS:
                yield epoch, step
                step = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != WORLD_SIZE:
        raise SystemExit(f"this plan's mesh has {WORLD_SIZE} ranks, not {world}: plan again for {world}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = build_mesh(device.type)
    dp_rank = data_parallel_rank(mesh)

    torch.manual_seed(SEED)  # the same initial weights on every rank
    model = parallelize(build_model().to(device), mesh)
    dataset = build_dataset()
    sampler = DistributedSampler(
        dataset, num_replicas=DATA_PARALLEL_SIZE, rank=dp_rank, shuffle=SHUFFLE, seed=SEED,
        drop_last=DROP_LAST,
    )
    loader = DataLoader(dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler, drop_last=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0006, betas=(0.6000000000000001, 0.996), eps=5e-09, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / 0.0006)  # stepped once per optimizer step
    print(f"rank {rank}: data-parallel rank {dp_rank} of {DATA_PARALLEL_SIZE}, mesh {mesh}", flush=True)

    steps = 0
    for epoch, micro_batches in optimizer_steps(loader, sampler, args.epochs):
        for k, (inputs, targets) in enumerate(micro_batches):
            if DATA_PARALLEL_SIZE > 1:  # reduce once per optimizer step, after its last micro-batch
                model.set_requires_gradient_sync(k == len(micro_batches) - 1)
            output = model(inputs.to(device))
            loss = nn.functional.mse_loss(output, targets.to(device), reduction=LOSS_REDUCTION)
            (loss * LOSS_SCALE).backward()
        if MAX_GRAD_NORM is not None:  # one norm over the whole (reduced, sharded) gradient
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        if rank == 0:
            print(f"epoch {epoch} step {steps} loss {loss.item():.6g}", flush=True)
        if steps == args.max_steps:
            break
    if rank == 0:
        print(f"done: {steps} optimizer steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
