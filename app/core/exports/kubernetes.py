"""`kubernetes`: a Kubeflow PyTorchJob manifest (YAML), one pod per node."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    ExportUnsupported,
    comment,
    even_alternative,
    num_nodes,
    pinned_ranks,
    require_uniform_nodes,
    summary,
)
from app.core.exports.yaml_writer import to_yaml


def export_kubernetes(x: ExportInput) -> Export:
    shape = require_uniform_nodes(x, "a PyTorchJob (one nprocPerNode for all pods)")
    if pinned_ranks(x):
        raise ExportUnsupported(
            "this plan gives each node group its own micro-batch, and a PyTorchJob cannot pin worker "
            "indices to node types; use the slurm or torchrun export, or an even split",
            pointer="/topology/node_groups",
            suggestions=even_alternative(x),
        )
    nodes = num_nodes(x)
    env = []
    if x.plan.micro_batch_size is not None:
        env = [
            {"name": "GLOBAL_BATCH_SIZE", "value": str(x.plan.global_batch_size)},
            {"name": "MICRO_BATCH_SIZE", "value": str(x.plan.micro_batch_size)},
            {"name": "GRADIENT_ACCUMULATION_STEPS", "value": str(x.plan.gradient_accumulation_steps)},
        ]

    def replica(count: int) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "pytorch",  # the training operator looks for this container name
            "image": x.options.image,
            # The operator sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT,
            # which torchrun reads as defaults.
            "command": ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(shape), x.options.script],
            "resources": {"limits": {"nvidia.com/gpu": shape}},
        }
        if env:
            container["env"] = env
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": x.options.job_name},
        "spec": {"nprocPerNode": str(shape), "pytorchReplicaSpecs": specs},
    }
    text = comment(summary(x)) + "\n" + to_yaml(manifest) + "\n"
    return Export("kubernetes", "application/yaml", "pytorchjob.yaml", text)
