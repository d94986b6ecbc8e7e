#!/usr/bin/env python3
"""DDP training loop for a batchplan plan.

batchplan: 20 GPUs, data-parallel size 20
global batch 1000, accumulation 1, uneven micro-batches per replica group:
  ranks 0-7 (h100): micro-batch 56, loss scale 1.12
  ranks 8-15 (h100): micro-batch 55, loss scale 1.1
  ranks 16-19 (a100): micro-batch 28, loss scale 0.56

Launch one process per GPU with torchrun (see the torchrun export for multi-node), e.g.
    torchrun --nproc-per-node gpu train.py
Replace build_dataset() and build_model(). To try the loop first on CPU with a toy model and
data set (gloo backend): BATCHPLAN_TOY=1 torchrun --nproc-per-node 20 train.py --max-steps 2

Restarted (by torchrun's elastic agent, or by hand) on another number of processes that keeps the
global batch, it resumes from its checkpoint (--checkpoint) with that size's micro-batch and
accumulation and skips exactly the samples the steps before it consumed (docs/resume.md).
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
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset


class ProportionalSampler(Sampler):
    """Replica `rank`'s indices when replicas take micro-batches of different sizes.

    Micro-step k covers positions [k*S, (k+1)*S) of the epoch's index list, S the sum of all
    micro-batch sizes; replica r reads the slice of length micro[r] after the lower ranks'.
    The list is shuffled with seed + epoch (as DistributedSampler does), padded by repeating
    from the start, or truncated with drop_last, to a whole number of micro-steps.
    """

    def __init__(self, num_samples, micro_batch_sizes, rank, *, shuffle=True, seed=0, drop_last=False):
        self.num_samples, self.shuffle, self.seed, self.epoch = num_samples, shuffle, seed, 0
        self.micro_batch_size = micro_batch_sizes[rank]
        self.samples_per_micro_step = sum(micro_batch_sizes)
        self.offset = sum(micro_batch_sizes[:rank])
        per_step = self.samples_per_micro_step
        self.micro_steps = num_samples // per_step if drop_last else -(-num_samples // per_step)
        self.total_size = self.micro_steps * per_step

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.micro_steps * self.micro_batch_size

    def __iter__(self):
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            indices = list(range(self.num_samples))
        while len(indices) < self.total_size:
            indices += indices[: self.total_size - len(indices)]
        indices = indices[: self.total_size]
        for step in range(self.micro_steps):
            start = step * self.samples_per_micro_step + self.offset
            yield from indices[start : start + self.micro_batch_size]

# ---- the plan: change it by planning again, not by hand --------------------------------
DATA_PARALLEL_SIZE = 20  # the plan's processes; other sizes: ELASTIC_TABLE below
GLOBAL_BATCH_SIZE = 1000
GRADIENT_ACCUMULATION_STEPS = 1
# (first rank, stop rank, micro-batch size, loss scale) for data-parallel ranks [first, stop)
REPLICA_GROUPS = [(0, 8, 56, 1.12), (8, 16, 55, 1.1), (16, 20, 28, 0.56)]
LOSS_REDUCTION = "mean"
# "token": each valid token of a step weighs the same (see with_loss_scales); "sample": loss scales.
LOSS_NORMALIZATION = "sample"
IGNORE_INDEX = -100  # labels the token loss skips (padding), as torch's cross_entropy does
SHUFFLE, SEED, DROP_LAST = True, 0, False
EPOCHS = 1  # None: as many as TRAIN_STEPS takes
TRAIN_STEPS = None  # the run's optimizer steps; None: every step of EPOCHS
LR = 0.1  # the peak; planned_lr(step) is every step's
MAX_GRAD_NORM = None  # clip the all-reduced gradient to this global norm; None: no clipping


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
    """The plan's lr at optimizer step `step` (from 0): constant 0.1 (a placeholder: the plan
    has no learning_rate).
    """
    return lr_at(step, start=0.1, peak=0.1, warmup=0)


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


def with_loss_scales(loader, loss_scale, accumulation: int, world: int, device: torch.device):
    """(inputs, targets, scale) per micro-batch. Under token normalisation a step's scale is
    world / N, N its valid tokens over all micro-batches and ranks (an all-reduce of the
    counts, as torchtitan does): DDP's mean over ranks then weighs every token 1/N.
    A mean per micro-batch or per rank would weigh tokens unequally where lengths differ."""
    if LOSS_NORMALIZATION != "token":
        for inputs, targets in loader:
            yield inputs, targets, loss_scale
        return
    step: list = []
    for batch in loader:
        step.append(batch)
        if len(step) < accumulation:
            continue
        valid = sum((targets != IGNORE_INDEX).sum() for _, targets in step).to(device)
        dist.all_reduce(valid)
        for inputs, targets in step:
            yield inputs, targets, world / valid.item()
        step = []


# ---- resuming: this script's own checkpoint, on whatever world size it starts with ---------
# Data-parallel sizes the run may go on with after a restart, the global batch kept:
# {size: (micro-batch, accumulation, exact)}; exact: every later step sees the global batch the
# uninterrupted run would have seen (False: the epoch ends elsewhere on that size, where
# padding or drop_last depend on it; None: the plan has no dataset to tell).
ELASTIC_TABLE = {20: (None, 1, True)}
# The run's identity: its global batch, data and recipe, whatever the world size. A checkpoint
# of another run is refused, and the default checkpoint file is named by it.
RUN_ID = "18b5ea74e24a"


def replica_settings(rank: int, world: int):
    """(micro-batch, accumulation, loss scale or None under token normalisation) of `rank`
    when `world` processes run: the plan's own replica groups, or the elastic table's."""
    if world == DATA_PARALLEL_SIZE:
        for first, stop, micro, scale in REPLICA_GROUPS:
            if first <= rank < stop:
                return micro, GRADIENT_ACCUMULATION_STEPS, scale
        raise ValueError(f"rank {rank} is in no replica group")
    if world not in ELASTIC_TABLE:
        raise SystemExit(
            f"this plan keeps its global batch of {GLOBAL_BATCH_SIZE} on {sorted(ELASTIC_TABLE)} "
            f"processes, not {world}: plan again for {world}"
        )
    micro, accumulation, _ = ELASTIC_TABLE[world]
    if LOSS_NORMALIZATION == "token":
        return micro, accumulation, None
    # As the plan's loss_scale: data_parallel_size x micro / global for a mean, x 1 / global for a sum.
    return micro, accumulation, world * (micro if LOSS_REDUCTION == "mean" else 1) / GLOBAL_BATCH_SIZE


def check_launch_env(micro_batch_size: int, accumulation: int) -> None:
    """The launch script (torchrun, slurm, kubernetes exports) exports the plan's batch sizes: a
    launch script from another plan would start a batch this loop's loss scales do not fit. An
    elastic launch exports only the global batch: the rest follows the world size."""
    planned = {"GLOBAL_BATCH_SIZE": GLOBAL_BATCH_SIZE, "MICRO_BATCH_SIZE": micro_batch_size,
               "GRADIENT_ACCUMULATION_STEPS": accumulation}
    for name, value in planned.items():
        if os.environ.get(name, str(value)) != str(value):
            raise SystemExit(f"the launch script sets {name}={os.environ[name]}, this script's plan has "
                             f"{value}: export both from the same plan")


class SkipSampler(Sampler):
    """A sampler's indices after its first `skip` (the samples of the steps a checkpoint took),
    so that the skipped micro-batches are never loaded."""

    def __init__(self, sampler, skip: int = 0):
        self.sampler, self.skip = sampler, skip

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)


def make_sampler(dataset: Dataset, rank: int, world: int) -> SkipSampler:
    if world != DATA_PARALLEL_SIZE:
        return SkipSampler(DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST,
        ))
    # Each micro-step's samples are shared out by micro-batch size, rank by rank.
    micro_batch_sizes = [micro for first, stop, micro, _ in REPLICA_GROUPS for _ in range(first, stop)]
    return SkipSampler(ProportionalSampler(
        len(dataset), micro_batch_sizes, rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST
    ))


def save_checkpoint(path: str, model, optimizer, scheduler, position: dict) -> None:
    """Rank 0's: written to a temporary file and renamed, so a process killed while saving
    leaves the last whole checkpoint."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "run_id": RUN_ID, **position}
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def load_checkpoint(path: str, model, optimizer, scheduler):
    """The saved position (step, epoch, step_in_epoch, data_parallel_size), the states
    restored; None without a checkpoint. The same rng state on every rank: the data order comes
    from the sampler's seed + epoch, so nothing here depends on the old ranks' states."""
    if not os.path.exists(path):
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("run_id") != RUN_ID:
        raise SystemExit(f"{path} is the checkpoint of another run ({saved.get('run_id')}, this one is "
                         f"{RUN_ID}): give this run's own with --checkpoint")
    model.load_state_dict(saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    scheduler.load_state_dict(saved.pop("scheduler"))
    torch.set_rng_state(saved.pop("rng"))
    return saved


def build_optimizer(params) -> torch.optim.Optimizer:
    """A placeholder: the plan has no learning_rate."""
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=TRAIN_STEPS or 0,
                        help="stop after this many optimizer steps")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--checkpoint", default=f"checkpoint-{RUN_ID}.pt",
                        help="resume from this file when it exists; rank 0 saves to it (on shared storage)")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="optimizer steps; 0: never")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()  # torchrun's WORLD_SIZE: any in ELASTIC_TABLE
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    micro_batch_size, accumulation, loss_scale = replica_settings(rank, world)
    check_launch_env(micro_batch_size, accumulation)

    torch.manual_seed(SEED)  # DDP also broadcasts rank 0's weights at construction
    net = build_model().to(device)
    optimizer = build_optimizer(net.parameters())
    # Stepped once per optimizer step: planned_lr(step) is the lr of step `step`.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / 0.1)
    saved = load_checkpoint(args.checkpoint, net, optimizer, scheduler)
    step, epoch, skip_steps = (saved["step"], saved["epoch"], saved["step_in_epoch"]) if saved else (0, 0, 0)
    if rank == 0:
        print(f"world size {world}: micro-batch {micro_batch_size} x accumulation {accumulation} x {world} "
              f"= global batch {GLOBAL_BATCH_SIZE}", flush=True)
    if rank == 0 and saved:
        exact = ELASTIC_TABLE.get(world, (0, 0, True))[2]
        print(f"resumed at optimizer step {step} (epoch {epoch}, step {skip_steps} of it) from a checkpoint "
              f"of {saved['data_parallel_size']} processes on {world}: each rank skips "
              f"{skip_steps * accumulation} micro-batches" + ("" if exact is not False else
              "; on this size the epoch ends elsewhere, so the global batches differ from its end on"),
              flush=True)
    model = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)
    dataset = build_dataset()
    sampler = make_sampler(dataset, rank, world)
    # The sampler owns drop_last; the DataLoader keeps every index it is given.
    loader = DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, drop_last=False)

    seen = []  # the size of every micro-batch this rank trained on
    while (not args.epochs or epoch < args.epochs) and not (args.max_steps and step >= args.max_steps):
        sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first order
        # The samples of the steps a checkpoint took in this epoch are skipped (resume only).
        sampler.skip, taken = skip_steps * accumulation * micro_batch_size, skip_steps
        optimizer.zero_grad(set_to_none=True)
        # Micro-batches past the last whole optimizer step are skipped: under no_sync their
        # gradients would stay local and leak, unscaled, into the next epoch's first step.
        usable = len(loader) // accumulation * accumulation
        steps = with_loss_scales(loader, loss_scale, accumulation, world, device)
        for i, (inputs, targets, scale) in enumerate(steps):
            if i >= usable:
                break
            inputs, targets = inputs.to(device), targets.to(device)
            seen.append(len(inputs))
            sync = (i + 1) % accumulation == 0
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
            step, taken = step + 1, taken + 1
            if rank == 0 and (step == 1 or step % args.log_every == 0):
                print(f"epoch {epoch} step {step} loss {loss.item():.6g} lr {scheduler.get_last_lr()[0]:.6g}",
                      flush=True)
            done = bool(args.max_steps and step >= args.max_steps)
            if rank == 0 and args.checkpoint_every and (step % args.checkpoint_every == 0 or done):
                last = i + 1 == usable  # the position after this step: the next epoch's start
                position = {"step": step, "epoch": epoch + last, "step_in_epoch": 0 if last else taken,
                            "data_parallel_size": world}
                save_checkpoint(args.checkpoint, model, optimizer, scheduler, position)
            if done:
                break
        epoch, skip_steps = epoch + 1, 0
    if rank == 0:
        print(f"done: {step} optimizer steps", flush=True)
    print(f"rank {rank}/{world}: {step} optimizer steps, {len(seen)} micro-batches of sizes "
          f"{sorted(set(seen))}, accumulation {accumulation}", flush=True)
    # DDP's reducer holds the process group and its last work objects; left to interpreter
    # shutdown, gloo's threads free tensors after Python is gone and the rank aborts with
    # "terminate called without an active exception". Free them while Python is alive (DDP's
    # hooks form reference cycles, hence the collect), then let every rank arrive before any
    # tears the group down.
    del model, net, optimizer, scheduler, loader, sampler
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
