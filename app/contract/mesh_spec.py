"""Which checks run the plan's own device mesh, and what such a check needs of the host and
the model. Pure (standard library and the core): the web process decides before any rank runs.

A mesh check runs whenever the plan has tensor, pipeline or context sizes above 1, or a
`data_parallel_shard` above 1 (FSDP, HSDP): one real process per mesh rank, because a tensor
or pipeline peer cannot be emulated by a loop the way a DDP replica can.
"""

from __future__ import annotations

from math import prod

from app.core.cluster.device_mesh import full_sizes
from app.core.records.plan import Plan, Wrapper

# The synthetic model is Linear(8, 16), Tanh, Linear(16, 4) (synthetic_model.py): tensor
# parallel shards its 16 hidden units, a pipeline stage holds at least one of its 3 layers.
SYNTHETIC_HIDDEN = 16
SYNTHETIC_LAYERS = 3

# Why a check refuses context parallel, as torch 2.13 on CPU/gloo behaves
# (tests/worker/checks/mesh/context_parallel_repro.py; test_mesh_checks.py runs it on another torch
# release and holds its cause, DTensor's registry, on every run): the forward runs and matches
# whole attention, the backward has no sharding rule.
CONTEXT_PARALLEL_REFUSAL = (
    "context parallel cannot train on this worker: torch 2.13 on CPU runs context_parallel's "
    "forward (ring attention over scaled_dot_product_attention), but its backward raises "
    "NotImplementedError (aten._scaled_dot_product_flash_attention_for_cpu_backward has no "
    "sharding strategy registered), so a gradient check would have to pretend; check with "
    "context 1, whose data-parallel arithmetic is the same (cp peers read the same samples, as "
    "tensor peers do), or on a GPU worker with your own model"
)


def mesh_sizes(plan: Plan) -> dict[str, int] | None:
    """Every mesh dimension's size, when the plan needs a mesh check; None for plain DDP."""
    mesh = plan.device_mesh
    if mesh is None:
        return None
    sizes = full_sizes(mesh)
    if sizes["pp"] * sizes["cp"] * sizes["tp"] == 1 and sizes["dp_shard"] == 1:
        return None
    return sizes


def mesh_world(sizes: dict[str, int]) -> int:
    return prod(sizes.values())


def wrapper_of(sizes: dict[str, int]) -> Wrapper:
    """As the plan's device mesh says (torchtitan's rule): FSDP when dp_shard or cp is above 1."""
    if sizes["dp_shard"] == 1 and sizes.get("cp", 1) == 1:
        return "ddp"
    return "fsdp" if sizes["dp_replicate"] == 1 else "hsdp"


def refusal(
    sizes: dict[str, int], *, processes: int, synthetic: bool, parallelize: bool
) -> tuple[str, str] | None:
    """(why, pointer) when this worker cannot run the mesh, else None."""
    world = mesh_world(sizes)
    if sizes["cp"] > 1:
        return CONTEXT_PARALLEL_REFUSAL, "/plan/parallelism/context"
    if world > processes:
        return (
            f"a mesh check runs one process per mesh rank (tensor and pipeline peers are always real "
            f"processes): this plan's mesh has {world} ranks and this worker runs at most {processes} "
            f"(BATCHPLAN_PROCESSES_PER_HOST); check a topology of at most {processes} GPUs with the "
            f"same parallel sizes",
            "/plan/topology",
        )
    model_parallel = sizes["tp"] > 1 or sizes["pp"] > 1
    if model_parallel and not synthetic and not parallelize:
        return (
            "a tensor- or pipeline-parallel check of a registered model needs its parallelization: "
            "define `parallelize(model, mesh)` in the factory's module, next to the factory, that "
            "applies parallelize_module on mesh['tp'] (and returns the pipeline stage's module for "
            "mesh['pp'] when the plan has one)",
            "/model",
        )
    if synthetic and sizes["tp"] > 1 and SYNTHETIC_HIDDEN % sizes["tp"]:
        fits = [t for t in (2, 4, 8, 16) if SYNTHETIC_HIDDEN % t == 0]
        return (
            f"the synthetic model's {SYNTHETIC_HIDDEN} hidden units shard over tensor sizes "
            f"{', '.join(map(str, fits))}; tensor {sizes['tp']} does not divide them",
            "/plan/parallelism/tensor",
        )
    if synthetic and sizes["pp"] > SYNTHETIC_LAYERS:
        return (
            f"the synthetic model has {SYNTHETIC_LAYERS} layers, so at most {SYNTHETIC_LAYERS} "
            f"pipeline stages; pipeline {sizes['pp']} has more",
            "/plan/parallelism/pipeline",
        )
    return None
