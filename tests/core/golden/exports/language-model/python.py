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
import itertools
import math
import os

import torch
import torch.distributed as dist
from torch import nn
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

# ---- the plan: change it by planning again, not by hand --------------------------------
WORLD_SIZE = 32  # the plan's; other sizes: ELASTIC_TABLE below
TENSOR_PARALLEL_SIZE = 2
MODEL_PARALLEL_SIZE = 2  # tensor peers share their data: world = data-parallel size x this
DATA_PARALLEL_SIZE = 16  # the sampler's num_replicas: dp_replicate x dp_shard, never the world
DATA_PARALLEL_SHARD = 1  # 1: DDP, DATA_PARALLEL_SIZE: FSDP, else HSDP
GLOBAL_BATCH_SIZE = 1024
MICRO_BATCH_SIZE = 2
GRADIENT_ACCUMULATION_STEPS = 32
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


def parallelize(model: nn.Module, mesh, dp: int, shard: int) -> nn.Module:
    """Tensor parallel on mesh["tp"] (the toy's linear pair: column- then row-wise; give your
    model's own plan), then fully_shard over the data-parallel dimensions."""
    if "tp" in mesh.mesh_dim_names:
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if dp > 1:
        # FSDP shards over dp_shard; HSDP (and DDP's arithmetic, with shards of one rank)
        # replicates over dp_replicate as well.
        dims = ("dp_shard",) if shard == dp else ("dp_replicate", "dp_shard")
        fully_shard(model, mesh=mesh[dims] if len(dims) > 1 else mesh[dims[0]])
    return model


def build_mesh(device_type: str, dp: int, shard: int):
    """The mesh in torchtitan's order; dp_shard stays (of size 1 for DDP beside tensor parallel)
    wherever fully_shard needs it."""
    sizes = {"dp_replicate": dp // shard, "dp_shard": shard, "tp": TENSOR_PARALLEL_SIZE}
    keep = {"dp_replicate": dp // shard > 1, "dp_shard": dp > 1, "tp": TENSOR_PARALLEL_SIZE > 1}
    names = [name for name in sizes if keep[name]] or ["dp_replicate"]
    return init_device_mesh(device_type, tuple(sizes[n] for n in names), mesh_dim_names=tuple(names))


def data_parallel_rank(mesh, shard: int) -> int:
    """This rank's coordinate in dp_replicate x dp_shard: tensor peers share it, and the data."""
    names = mesh.mesh_dim_names
    replicate = mesh["dp_replicate"].get_local_rank() if "dp_replicate" in names else 0
    shard_rank = mesh["dp_shard"].get_local_rank() if "dp_shard" in names else 0
    return replicate * shard + shard_rank


# ---- resuming: this script's own sharded checkpoint, on whatever world size it starts with --
# {data-parallel size: (micro-batch, accumulation, exact, FSDP shard group)} that keep the global
# batch; exact: every later step sees the global batch the uninterrupted run would have seen.
ELASTIC_TABLE = {1: (2, 512, True, 1), 2: (2, 256, True, 1), 4: (2, 128, True, 1), 8: (2, 64, True, 1), 16: (2, 32, True, 1)}
RUN_ID = "0e99a24c7a1a"  # the run's identity at every size: another run's checkpoint is refused


def mesh_settings(world: int):
    """(data-parallel size, micro-batch, accumulation, shard group) when `world` processes run."""
    dp = world // MODEL_PARALLEL_SIZE
    if world % MODEL_PARALLEL_SIZE or dp not in ELASTIC_TABLE:
        sizes = sorted(size * MODEL_PARALLEL_SIZE for size in ELASTIC_TABLE)
        raise SystemExit(f"this plan keeps its global batch of {GLOBAL_BATCH_SIZE} on {sizes} processes, "
                         f"not {world}: plan again for {world}")
    micro, accumulation, _, shard = ELASTIC_TABLE[dp]
    return dp, micro, accumulation, shard


def save_checkpoint(directory: str, model, optimizer, scheduler, position: dict) -> None:
    """Every rank writes its shards (a collective); then rank 0 names the new one as the latest."""
    import json

    path = os.path.join(directory, f"step-{position['step']}")
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    if dist.get_rank() == 0:
        latest = {"path": path, "run_id": RUN_ID, "scheduler": scheduler.state_dict(), **position}
        with open(os.path.join(directory, "latest.json.tmp"), "w") as out:
            json.dump(latest, out)
        os.replace(os.path.join(directory, "latest.json.tmp"), os.path.join(directory, "latest.json"))


def load_checkpoint(directory: str, model, optimizer, scheduler):
    """The saved position, the states loaded resharded onto this mesh; None without one."""
    import json

    if not os.path.exists(os.path.join(directory, "latest.json")):
        return None
    with open(os.path.join(directory, "latest.json")) as saved:
        latest = json.load(saved)
    if latest["run_id"] != RUN_ID:
        raise SystemExit(f"{directory} holds the checkpoint of another run ({latest['run_id']}, this one is "
                         f"{RUN_ID}): give this run's own with --checkpoint")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=latest["path"])
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(latest["scheduler"])
    return latest


class SkipSampler(DistributedSampler):
    """DistributedSampler without its first `skip` indices: the samples of the steps a
    checkpoint took in this epoch, never loaded."""

    skip = 0

    def __len__(self) -> int:
        return max(super().__len__() - self.skip, 0)

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)


def optimizer_steps(loader, sampler, epochs, accumulation, start_epoch, skip_steps):
    """(epoch, step in it, the epoch's whole steps, the micro-batches of one optimizer step),
    epoch after epoch from a checkpoint's position; a partial last step is dropped, or its
    gradients would leak into the next epoch's first step."""
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first order
        taken = skip_steps if epoch == start_epoch else 0
        sampler.skip = taken * accumulation * loader.batch_size
        whole, step = taken + len(loader) // accumulation, []
        for batch in loader:
            step.append(batch)
            if len(step) == accumulation:
                taken += 1
                yield epoch, taken, whole, step
                step = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps")
    parser.add_argument("--checkpoint", default=f"checkpoint-{RUN_ID}",
                        help="a directory: resume from it when it holds a checkpoint; every rank saves to it")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="optimizer steps; 0: never")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    dp, micro, accumulation, shard = mesh_settings(world)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = build_mesh(device.type, dp, shard)
    dp_rank = data_parallel_rank(mesh, shard)

    torch.manual_seed(SEED)  # the same initial weights on every rank
    model = parallelize(build_model().to(device), mesh, dp, shard)
    dataset = build_dataset()
    sampler = SkipSampler(
        dataset, num_replicas=dp, rank=dp_rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST,
    )
    loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0006, betas=(0.6000000000000001, 0.996), eps=5e-09, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / 0.0006)  # stepped once per optimizer step
    saved = load_checkpoint(args.checkpoint, model, optimizer, scheduler)
    steps, epoch, skip = (saved["step"], saved["epoch"], saved["step_in_epoch"]) if saved else (0, 0, 0)
    # As the plan's loss_scale: data_parallel_size x micro / global for a mean, x 1 / global for a sum.
    loss_scale = dp * (micro if LOSS_REDUCTION == "mean" else 1) / GLOBAL_BATCH_SIZE
    print(f"rank {rank}: data-parallel rank {dp_rank} of {dp}, world size {world}: micro-batch {micro} x "
          f"accumulation {accumulation}, mesh {mesh}", flush=True)
    if rank == 0 and saved:
        print(f"resumed at optimizer step {steps} (epoch {epoch}, step {skip} of it) from a checkpoint of "
              f"{saved['data_parallel_size']} data-parallel ranks on {dp}", flush=True)

    done = bool(args.max_steps and steps >= args.max_steps)
    for epoch, taken, whole, micro_batches in optimizer_steps(
        loader, sampler, args.epochs, accumulation, epoch, skip
    ):
        if done:
            break
        for k, (inputs, targets) in enumerate(micro_batches):
            if dp > 1:  # reduce once per optimizer step, after its last micro-batch
                model.set_requires_gradient_sync(k == len(micro_batches) - 1)
            output = model(inputs.to(device))
            loss = nn.functional.mse_loss(output, targets.to(device), reduction=LOSS_REDUCTION)
            (loss * loss_scale).backward()
        if MAX_GRAD_NORM is not None:  # one norm over the whole (reduced, sharded) gradient
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        if rank == 0:
            print(f"epoch {epoch} step {steps} loss {loss.item():.6g}", flush=True)
        done = bool(args.max_steps and steps >= args.max_steps)
        if args.checkpoint_every and (steps % args.checkpoint_every == 0 or done):
            last = taken == whole  # the position after this step: the next epoch's start
            position = {"step": steps, "epoch": epoch + last, "step_in_epoch": 0 if last else taken,
                        "data_parallel_size": dp}
            save_checkpoint(args.checkpoint, model, optimizer, scheduler, position)
    if rank == 0:
        print(f"done: {steps} optimizer steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
