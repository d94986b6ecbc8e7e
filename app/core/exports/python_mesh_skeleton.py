"""The `python` export for a plan whose mesh is more than plain DDP: the same training loop on
the plan's device mesh (torchtitan's order), tensor parallel with parallelize_module,
FSDP / HSDP (and DDP's arithmetic beside tensor parallel) with fully_shard, and data sharded
by data-parallel rank. Pipeline and context parallel depend on how a model splits into stages
or shards its sequence: those plans are refused with what to use instead."""

from __future__ import annotations

from app.core.exports.common import Export, ExportInput, ExportUnsupported, summary, uniform_gpus_per_node
from app.core.exports.python_literal import py_literal
from app.core.exports.recipe_code import lr_block, max_grad_norm, optimizer_call, scheduler_call

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
WORLD_SIZE = __WORLD__
MESH_DIM_NAMES = __NAMES__  # torchtitan's order: pp, dp_replicate, dp_shard, cp, tp
MESH_SHAPE = __SHAPE__
DATA_PARALLEL_SIZE = __DP__  # the sampler's num_replicas: dp_replicate x dp_shard, never the world
DATA_PARALLEL_SHARD = __SHARD__  # 1: DDP, DATA_PARALLEL_SIZE: FSDP, else HSDP
GLOBAL_BATCH_SIZE = __GLOBAL__
MICRO_BATCH_SIZE = __MICRO__
GRADIENT_ACCUMULATION_STEPS = __ACCUM__
LOSS_SCALE = __SCALE__
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
    optimizer = __OPTIMIZER_CALL__
    scheduler = __SCHEDULER__  # stepped once per optimizer step
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
        "__SUMMARY__": "\n".join(summary(x)).replace('"""', "'''").replace("\\", "\\\\"),
        "__NPROC__": str(shape if (shape := uniform_gpus_per_node(x)) is not None else "gpu"),
        "__SCRIPT__": x.options.script,
        "__WORLD__": str(p.world_size),
        "__NAMES__": py_literal(tuple(d.name for d in mesh.dimensions)),
        "__SHAPE__": py_literal(tuple(d.size for d in mesh.dimensions)),
        "__DP__": str(p.data_parallel_size),
        "__SHARD__": str(mesh.data_parallel_shard),
        "__GLOBAL__": str(p.global_batch_size),
        "__MICRO__": str(p.micro_batch_size),
        "__ACCUM__": str(p.gradient_accumulation_steps),
        "__SCALE__": py_literal(p.replica_groups[0].loss_scale),
        "__REDUCTION__": py_literal(p.loss_reduction),
        "__EPOCHS__": py_literal(sampler.epochs if sampler and sampler.epochs else 1),
        "__MAX_GRAD_NORM__": py_literal(max_grad_norm(x)),
        "__LR_FUNCTION__": lr_block(x),
        "__OPTIMIZER_CALL__": optimizer_call(x, "model.parameters()"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
    }
    for name, default in (("shuffle", True), ("seed", 0), ("drop_last", False)):
        fields[f"__{name.upper()}__"] = py_literal(getattr(sampler, name) if sampler else default)
    text = _SKELETON
    for token, value in fields.items():
        text = text.replace(token, value)
    return Export("python", "text/plain", "train.py", text)
