"""The `python` export for a plan whose mesh is more than plain DDP: the same training loop on
the plan's device mesh (torchtitan's order), tensor parallel with parallelize_module,
FSDP / HSDP (and DDP's arithmetic beside tensor parallel) with fully_shard, and data sharded
by data-parallel rank. Pipeline and context parallel depend on how a model splits into stages
or shards its sequence: those plans are refused with what to use instead."""

from __future__ import annotations

from app.core.exports.parts.elastic_table import elastic_table, run_id, table_source
from app.core.exports.parts.export_types import Export, ExportInput, ExportUnsupported
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import lr_block, max_grad_norm, optimizer_call, scheduler_call
from app.core.exports.python_source.mesh_resume_source import MESH_RESUME_SOURCE
from app.core.exports.python_source.skeleton_source import render_skeleton

_SKELETON = '''#!/usr/bin/env python3
"""Training loop on a device mesh for a batchplan plan.

__SUMMARY__

Launch one process per GPU with torchrun, e.g.
    torchrun --nproc-per-node __NPROC__ __SCRIPT__
Replace build_dataset() and build_model() (and the tensor-parallel plan in parallelize()). To try
the loop first on CPU with a toy model and data set (gloo):
    BATCHPLAN_TOY=1 torchrun --nproc-per-node __WORLD__ __SCRIPT__ --max-steps 2
"""

from __future__ import annotations

import argparse
import gc
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
WORLD_SIZE = __WORLD__  # the plan's; other sizes: ELASTIC_TABLE below
TENSOR_PARALLEL_SIZE = __TP__
MODEL_PARALLEL_SIZE = __TP__  # tensor peers share their data: world = data-parallel size x this
DATA_PARALLEL_SIZE = __DP__  # the sampler's num_replicas: dp_replicate x dp_shard, never the world
DATA_PARALLEL_SHARD = __SHARD__  # 1: DDP, DATA_PARALLEL_SIZE: FSDP, else HSDP
GLOBAL_BATCH_SIZE = __GLOBAL__
MICRO_BATCH_SIZE = __MICRO__
GRADIENT_ACCUMULATION_STEPS = __ACCUM__
LOSS_REDUCTION = __REDUCTION__
SHUFFLE, SEED, DROP_LAST = __SHUFFLE__, __SEED__, __DROP_LAST__
EPOCHS = __EPOCHS__
MAX_GRAD_NORM = __MAX_GRAD_NORM__  # clip the reduced gradient to this global norm; None: no clipping


__LR_FUNCTION__


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


__RESUME__


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
__PROCESS_GROUP__
    rank, world = dist.get_rank(), dist.get_world_size()
    dp, micro, accumulation, shard = mesh_settings(world)
__DEVICE__
    mesh = build_mesh(device.type, dp, shard)
    dp_rank = data_parallel_rank(mesh, shard)

    torch.manual_seed(SEED)  # the same initial weights on every rank
    model = parallelize(build_model().to(device), mesh, dp, shard)
    dataset = build_dataset()
    sampler = SkipSampler(
        dataset, num_replicas=dp, rank=dp_rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST,
    )
    loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=False)
    optimizer = __OPTIMIZER_CALL__
    scheduler = __SCHEDULER__  # stepped once per optimizer step
    saved = load_checkpoint(args.checkpoint, model, optimizer, scheduler)
    steps, epoch, skip = (saved["step"], saved["epoch"], saved["step_in_epoch"]) if saved else (0, 0, 0)
    # As the plan's loss_scale: data_parallel_size x micro / global for a mean, x 1 / global for a sum.
    loss_scale = dp * (micro if LOSS_REDUCTION == "mean" else 1) / GLOBAL_BATCH_SIZE
    print(f"rank {rank}: data-parallel rank {dp_rank} of {dp}, world size {world}: micro-batch {micro} x "
          f"accumulation {accumulation}, mesh {mesh}", flush=True)
    # Started again on a finished run: training nothing without a word looked like a hang.
    finished = bool(saved) and bool(
        (args.epochs and epoch >= args.epochs) or (args.max_steps and steps >= args.max_steps)
    )
    if rank == 0 and finished:
        print(f"{args.checkpoint} holds a finished run ({steps} optimizer steps, epoch {epoch}): nothing to "
              "train; raise --max-steps/--epochs to go on, or give another --checkpoint", flush=True)
    elif rank == 0 and saved:
        print(f"resumed at optimizer step {steps} (epoch {epoch}, step {skip} of it) from a checkpoint of "
              f"{saved['data_parallel_size']} data-parallel ranks on {dp}", flush=True)

    done, saved_at = finished or bool(args.max_steps and steps >= args.max_steps), steps
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
            saved_at = steps
    if args.checkpoint_every and saved_at != steps:
        # The end of the run is saved too (the epochs ran out between two checkpoints): a finished
        # run restarted from an earlier step would train its last steps again.
        position = {"step": steps, "epoch": args.epochs, "step_in_epoch": 0, "data_parallel_size": dp}
        save_checkpoint(args.checkpoint, model, optimizer, scheduler, position)
    if rank == 0 and not finished:
        print(f"done: {steps} optimizer steps", flush=True)
__TEARDOWN__


if __name__ == "__main__":
    main()
'''


def needs_mesh(x: ExportInput) -> bool:
    mesh = x.plan.device_mesh
    return mesh is not None and (x.plan.model_parallel_size > 1 or mesh.wrapper != "ddp")


def export_mesh_python(x: ExportInput) -> Export:
    p, mesh = x.plan, x.plan.device_mesh
    assert mesh is not None
    sizes = {d.name: d.size for d in mesh.dimensions}
    for name, field in (("pp", "pipeline"), ("cp", "context")):
        if sizes.get(name, 1) > 1:
            raise ExportUnsupported(
                f"the python skeleton builds tensor parallel and FSDP/HSDP meshes; {field} parallel "
                f"depends on how your model splits ({'its stages' if name == 'pp' else 'its attention'}): "
                f"use the torchrun export, whose environment states the mesh, with your framework",
                pointer=f"/parallelism/{field}",
                suggestions={f"parallelism.{field}": [1]},
            )
    if p.micro_batch_size is None:
        raise ExportUnsupported(
            "the mesh skeleton takes an even split (one micro-batch for every replica)",
            pointer="/divisibility",
            suggestions={},
        )
    sampler = p.sampler
    fields = {
        "__WORLD__": str(p.world_size),
        "__TP__": str(p.model_parallel_size),
        "__DP__": str(p.data_parallel_size),
        "__SHARD__": str(mesh.data_parallel_shard),
        "__GLOBAL__": str(p.global_batch_size),
        "__MICRO__": str(p.micro_batch_size),
        "__ACCUM__": str(p.gradient_accumulation_steps),
        "__REDUCTION__": py_literal(p.loss_reduction),
        "__EPOCHS__": py_literal(sampler.epochs if sampler and sampler.epochs else 1),
        "__MAX_GRAD_NORM__": py_literal(max_grad_norm(x)),
        "__LR_FUNCTION__": lr_block(x),
        "__OPTIMIZER_CALL__": optimizer_call(x, "model.parameters()"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
        "__FREED__": "model, optimizer, scheduler, loader, sampler, mesh",
    }
    for name, default in (("shuffle", True), ("seed", 0), ("drop_last", False)):
        fields[f"__{name.upper()}__"] = py_literal(getattr(sampler, name) if sampler else default)
    resume = MESH_RESUME_SOURCE.strip("\n").replace(
        "__ELASTIC__", table_source(elastic_table(x), shards=True)
    )
    fields["__RESUME__"] = resume.replace("__RUN_ID__", py_literal(run_id(x)))
    return render_skeleton(_SKELETON, x, fields)
