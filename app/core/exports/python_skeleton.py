"""`python`: a runnable DDP training loop (a torchrun script) that holds the plan, including
the per-rank micro-batches and loss scales of an uneven split. Data-parallel only."""

from __future__ import annotations

from app.core.exports.parts.common import require_data_parallel
from app.core.exports.parts.elastic_table import elastic_table, run_id, table_source
from app.core.exports.parts.export_types import Export, ExportInput
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import (
    lr_block,
    max_grad_norm,
    optimizer_call,
    optimizer_note,
    recipe,
    scheduler_call,
)
from app.core.exports.parts.training import optimizer_sentence
from app.core.exports.python_source.mesh_skeleton import export_mesh_python, needs_mesh
from app.core.exports.python_source.model_source import model_source
from app.core.exports.python_source.packed_skeleton import export_packed_python
from app.core.exports.python_source.proportional_sampler import (
    EVEN_SAMPLER_BODY,
    PROPORTIONAL_SAMPLER,
    PROPORTIONAL_SAMPLER_BODY,
)
from app.core.exports.python_source.resume_source import RESUME_SOURCE
from app.core.exports.python_source.skeleton_source import render_skeleton
from app.core.exports.python_source.stream_skeleton import export_stream_python

_SKELETON = '''#!/usr/bin/env python3
"""DDP training loop for a batchplan plan.

__SUMMARY__

Launch one process per GPU with torchrun (see the torchrun export for multi-node), e.g.
    torchrun --nproc-per-node __NPROC__ __SCRIPT__
Replace the placeholders build_dataset(), build_model() and loss_fn() (or export with
--model-factory package.module:function). To try the loop first on CPU with a toy model and
data set (gloo backend): BATCHPLAN_TOY=1 torchrun --nproc-per-node __WORLD__ __SCRIPT__ --max-steps 2

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
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler__TENSOR_DATASET__
__SAMPLER__
# ---- the plan: change it by planning again, not by hand --------------------------------
DATA_PARALLEL_SIZE = __WORLD__  # the plan's processes; other sizes: ELASTIC_TABLE below
GLOBAL_BATCH_SIZE = __GLOBAL__
GRADIENT_ACCUMULATION_STEPS = __ACCUM__
# (first rank, stop rank, micro-batch size, loss scale) for data-parallel ranks [first, stop)
REPLICA_GROUPS = __GROUPS__
LOSS_REDUCTION = __REDUCTION__
# "token": each valid token of a step weighs the same (see with_loss_scales); "sample": loss scales.
LOSS_NORMALIZATION = __NORMALIZATION__
IGNORE_INDEX = -100  # labels the token loss skips (padding), as torch's cross_entropy does
SHUFFLE, SEED, DROP_LAST = __SHUFFLE__, __SEED__, __DROP_LAST__
NUM_SAMPLES = __NUM_SAMPLES__  # the plan's dataset: its steps, warmup and decay follow from it
EPOCHS = __EPOCHS__  # None: as many as TRAIN_STEPS takes
TRAIN_STEPS = __TRAIN_STEPS__  # the run's optimizer steps; None: every step of EPOCHS
LR = __LR__  # the peak; planned_lr(step) is every step's
MAX_GRAD_NORM = __MAX_GRAD_NORM__  # clip the all-reduced gradient to this global norm; None: no clipping


__LR_FUNCTION__


TOY = os.environ.get("BATCHPLAN_TOY") == "1"


__MODEL__


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


__RESUME__


def build_optimizer(params) -> torch.optim.Optimizer:
    """__OPTIMIZER_SENTENCE__"""
    return __OPTIMIZER_CALL__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=TRAIN_STEPS or 0,
                        help="stop after this many optimizer steps")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--checkpoint", default=f"checkpoint-{RUN_ID}.pt",
                        help="resume from this file when it exists; rank 0 saves to it (on shared storage)")
__PROCESS_GROUP__
    rank, world = dist.get_rank(), dist.get_world_size()  # torchrun's WORLD_SIZE: any in ELASTIC_TABLE
__DEVICE__
    micro_batch_size, accumulation, loss_scale = replica_settings(rank, world)
    check_launch_env(micro_batch_size, accumulation)

    torch.manual_seed(SEED)  # DDP also broadcasts rank 0's weights at construction
    net = build_model().to(device)
    optimizer = build_optimizer(net.parameters())
    # Stepped once per optimizer step: planned_lr(step) is the lr of step `step`.
    scheduler = __SCHEDULER__
    saved = load_checkpoint(args.checkpoint, net, optimizer, scheduler)
    step, epoch, skip_steps = (saved["step"], saved["epoch"], saved["step_in_epoch"]) if saved else (0, 0, 0)
    if saved and ((args.epochs and epoch >= args.epochs) or (args.max_steps and step >= args.max_steps)):
        # Started again on a finished run: training nothing without a word looked like a hang.
        if rank == 0:
            print(f"{args.checkpoint} holds a finished run ({step} optimizer steps, epoch {epoch}): nothing "
                  "to train; raise --max-steps/--epochs to go on, or give another --checkpoint", flush=True)
        dist.barrier()
        dist.destroy_process_group()
        return
    stand_ins = [f.__name__ for f in (build_model, build_dataset, loss_fn) if hasattr(f, "placeholder")]
    if rank == 0 and stand_ins:
        print(f"PLACEHOLDERS in use: {', '.join(stand_ins)} (this skeleton's toy stand-ins): replace them "
              "with your model, data and loss, or export with --model-factory", flush=True)
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
    if NUM_SAMPLES is not None and len(dataset) != NUM_SAMPLES and not hasattr(build_dataset, "placeholder"):
        # Trained on another size, the plan's steps and its lr schedule would end early or late.
        raise SystemExit(f"build_dataset() gives {len(dataset):,} samples, the plan was made for "
                         f"{NUM_SAMPLES:,}: plan again with --num-samples {len(dataset)}")
    sampler = make_sampler(dataset, rank, world)
    # The sampler owns drop_last; the DataLoader keeps every index it is given.
    loader = DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, drop_last=False)

    seen = []  # the size of every micro-batch this rank trained on
    saved_at = step  # the step of the last checkpoint (the one resumed from, or none yet)
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
                saved_at = step
            if done:
                break
        epoch, skip_steps = epoch + 1, 0
    if rank == 0 and args.checkpoint_every and saved_at != step:
        # The end of the run is saved too, whatever --checkpoint-every: a finished run restarted
        # from an earlier step would train its last steps again.
        position = {"step": step, "epoch": epoch, "step_in_epoch": 0, "data_parallel_size": world}
        save_checkpoint(args.checkpoint, model, optimizer, scheduler, position)
    if rank == 0:
        print(f"done: {step} optimizer steps", flush=True)
    print(f"rank {rank}/{world}: {step} optimizer steps, {len(seen)} micro-batches of sizes "
          f"{sorted(set(seen))}, accumulation {accumulation}", flush=True)
__TEARDOWN__


if __name__ == "__main__":
    main()
'''


def export_python(x: ExportInput) -> Export:
    p = x.plan
    if p.stream is not None:
        return export_stream_python(x)
    model = model_source(x, x.request.packing is not None or needs_mesh(x))
    if x.request.packing is not None:
        return export_packed_python(x)
    if needs_mesh(x):
        return export_mesh_python(x)
    require_data_parallel(x, "the python skeleton (plain DDP)")
    groups = [(g.start, g.stop, g.micro_batch_size, g.loss_scale) for g in p.replica_groups]
    lr, _ = recipe(x)
    epochs = p.sampler.epochs if p.sampler and p.sampler.epochs else None
    full_run = epochs * p.sampler.optimizer_steps_per_epoch if epochs and p.sampler else None
    train_steps = lr.train_steps if lr.train_steps != full_run else None
    sentence = optimizer_sentence(x) if p.learning_rate else "A placeholder: the plan has no learning_rate."
    if optimizer_note(x):
        sentence += f"; {optimizer_note(x)}"
    fields = {
        "__SAMPLER__": "" if p.split == "even" else PROPORTIONAL_SAMPLER,
        "__RESUME__": RESUME_SOURCE.strip("\n")
        .replace("__MAKE_SAMPLER__", EVEN_SAMPLER_BODY if p.split == "even" else PROPORTIONAL_SAMPLER_BODY)
        .replace("__ELASTIC__", table_source(elastic_table(x)))
        .replace("__RUN_ID__", py_literal(run_id(x))),
        "__WORLD__": str(p.data_parallel_size),
        "__GLOBAL__": str(p.global_batch_size),
        "__ACCUM__": str(p.gradient_accumulation_steps),
        "__GROUPS__": py_literal(groups),
        "__REDUCTION__": py_literal(p.loss_reduction),
        "__NORMALIZATION__": py_literal(p.tokens.loss_normalization if p.tokens else "sample"),
        "__SHUFFLE__": py_literal(p.sampler.shuffle if p.sampler else True),
        "__SEED__": py_literal(p.sampler.seed if p.sampler else 0),
        "__DROP_LAST__": py_literal(p.sampler.drop_last if p.sampler else False),
        "__NUM_SAMPLES__": py_literal(x.request.dataset.num_samples if x.request.dataset else None),
        "__EPOCHS__": py_literal(epochs if epochs or train_steps else 1),
        "__TRAIN_STEPS__": py_literal(train_steps),
        "__LR__": py_literal(lr.lr),
        "__MAX_GRAD_NORM__": py_literal(max_grad_norm(x)),
        "__LR_FUNCTION__": lr_block(x),
        "__OPTIMIZER_SENTENCE__": sentence,
        "__OPTIMIZER_CALL__": optimizer_call(x, "params"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
        "__FREED__": "model, net, optimizer, scheduler, loader, sampler",
        "__MODEL__": model,
        "__TENSOR_DATASET__": "" if x.options.model_factory else ", TensorDataset",  # the toy's
    }
    return render_skeleton(_SKELETON, x, fields)
