"""The device mesh as environment variables, for the launch formats (torchrun, slurm,
kubernetes): a training script builds `init_device_mesh(device, shape, mesh_dim_names=names)`
from them and takes its sampler's rank and size from the data-parallel dimensions.

Only for plans whose mesh is more than plain DDP: a data-parallel-only launch stays as it was.
"""

from __future__ import annotations

from app.core.records.plan import Plan


def mesh_variables(plan: Plan) -> list[tuple[str, str]]:
    mesh = plan.device_mesh
    if mesh is None or (mesh.wrapper == "ddp" and plan.model_parallel_size == 1):
        return []
    return [
        ("MESH_DIM_NAMES", ",".join(d.name for d in mesh.dimensions)),
        ("MESH_SHAPE", ",".join(str(d.size) for d in mesh.dimensions)),
        ("DATA_PARALLEL_DIMS", ",".join(mesh.data_parallel_dimensions)),
        ("DATA_PARALLEL_SIZE", str(plan.data_parallel_size)),
        ("DATA_PARALLEL_SHARD", str(mesh.data_parallel_shard)),
        ("DATA_PARALLEL_WRAPPER", mesh.wrapper),
    ]


def mesh_export_lines(plan: Plan) -> list[str]:
    """`export NAME=VALUE ...` for a shell script (values are plain words and commas)."""
    variables = mesh_variables(plan)
    if not variables:
        return []
    return [
        "# The device mesh: init_device_mesh(device, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES); the "
        "sampler's num_replicas/rank are the DATA_PARALLEL_DIMS ones, never the global ones.",
        "export " + " ".join(f"{name}={value}" for name, value in variables),
    ]


def mesh_env_items(plan: Plan) -> list[dict[str, str]]:
    """Kubernetes container env entries."""
    return [{"name": name, "value": value} for name, value in mesh_variables(plan)]
