"""A registered check model that a tensor- or pipeline-parallel check can split, to register
and to copy from:

    BATCHPLAN_CHECK_MODELS="mesh_mlp=app.worker.example_mesh_models:mesh_mlp"

A mesh check looks for `parallelize(model, mesh)` in the factory's module. It gets a deep copy
of the factory's model and the check's DeviceMesh (torchtitan's dimension names: pp,
dp_replicate, dp_shard, cp, tp) and returns this rank's share: the pipeline stage's layers
(child names kept, so gradients are named as in the whole model), with parallelize_module
applied on mesh["tp"]. The check applies fully_shard over the data-parallel dimensions itself.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import Dataset

from app.worker.zoo.example_models import mlp


def mesh_mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The small classifier (Linear, GELU, Linear), split by `parallelize` below."""
    model, dataset, loss, _ = mlp(seed)
    return model, dataset, loss


def parallelize(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    names = mesh.mesh_dim_names or ()
    if "pp" in names:
        stages, stage = mesh["pp"].size(), mesh["pp"].get_local_rank()
        children = list(model.named_children())
        mine = children[stage * len(children) // stages : (stage + 1) * len(children) // stages]
        model = nn.Sequential(OrderedDict(mine))
    if "tp" in names:
        present = {name for name, _ in model.named_children()}
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        parallelize_module(model, mesh["tp"], {k: v for k, v in plan.items() if k in present})
    return model
