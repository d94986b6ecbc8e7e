"""`kubernetes`: a Kubeflow PyTorchJob manifest (YAML), one pod per node."""

from __future__ import annotations

import re
from typing import Any

from app.core.errors.domain import InvalidValue
from app.core.exports.parts.common import (
    comment,
    even_alternative,
    even_pairs,
    num_nodes,
    pinned_ranks,
    require_uniform_nodes,
    summary,
)
from app.core.exports.parts.export_types import Export, ExportInput, ExportUnsupported
from app.core.exports.parts.mesh_env import mesh_env_items
from app.core.exports.parts.preflight import check_args, preflight_lines
from app.core.exports.parts.shell import shell_words
from app.core.exports.parts.yaml_writer import to_yaml

# The training operator names pods and services `<job>-master-0` and `<job>-worker-<i>`, each a
# DNS-1035 label: a lower-case letter first, at most 63 characters.
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_MAX = 63


def check_job_name(name: str, nodes: int) -> None:
    longest = f"{name}-worker-{max(nodes - 2, 0)}" if nodes > 1 else f"{name}-master-0"
    if not DNS_1035.fullmatch(name) or len(longest) > LABEL_MAX:
        raise InvalidValue(
            f"job_name '{name[:LABEL_MAX]}' must be a DNS-1035 label (a lower-case letter first, then "
            f"lower-case letters, digits and '-') short enough that the pod name '{longest[:80]}' "
            f"is at most {LABEL_MAX} characters: at most {LABEL_MAX - len(longest) + len(name)} here"
        )


# Over 60 lines: the PyTorchJob is one YAML document built top to bottom; its parts read each
# other's names (the preflight, the env, the pod spec).
def export_kubernetes(x: ExportInput) -> Export:
    shape = require_uniform_nodes(x, "a PyTorchJob (one nprocPerNode for all pods)")
    if pinned_ranks(x):
        raise ExportUnsupported(
            "this plan gives each node group its own micro-batch, and a PyTorchJob cannot pin worker "
            "indices to node types; use the slurm or torchrun export, or an even split",
            pointer="/topology/node_groups",
            suggestions=even_alternative(x),
            combined_suggestions=even_pairs(x),
        )
    nodes = num_nodes(x)
    check_job_name(x.options.job_name, nodes)
    env = []
    if x.plan.micro_batch_size is not None:
        env = [
            {"name": "GLOBAL_BATCH_SIZE", "value": str(x.plan.global_batch_size)},
            {"name": "MICRO_BATCH_SIZE", "value": str(x.plan.micro_batch_size)},
            {"name": "GRADIENT_ACCUMULATION_STEPS", "value": str(x.plan.gradient_accumulation_steps)},
        ]
    env += mesh_env_items(x.plan)

    torchrun = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(shape)]
    command = [*torchrun, x.options.script]
    if x.options.preflight:
        # The check under the same torchrun line first; the training only if it passed.
        script = [
            "set -euo pipefail",
            *preflight_lines(x, shell_words([*torchrun, *check_args(x, every_node=nodes > 1)])),
            "exec " + shell_words(command),
        ]
        command = ["bash", "-c", "\n".join(script)]

    def replica(count: int) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "pytorch",  # the training operator looks for this container name
            "image": x.options.image,
            # The operator sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT,
            # which torchrun reads as defaults; it picks the port itself, so none is passed.
            "command": command,
            "resources": {"limits": {"nvidia.com/gpu": shape}},
            # NCCL and DataLoader workers share memory through /dev/shm, 64 MiB in a pod by default.
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }
        if env:
            container["env"] = env
        return {
            "replicas": count,
            # ExitCode: exit codes 1-127 (a failed preflight exits 1) fail the job for good;
            # 128 and above (killed, evicted) restart the pod.
            "restartPolicy": "ExitCode" if x.options.preflight else "OnFailure",
            "template": {
                "spec": {
                    "containers": [container],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                }
            },
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": x.options.job_name},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "nprocPerNode": str(shape),
            "pytorchReplicaSpecs": specs,
        },
    }
    header = [
        *summary(x),
        f"image {x.options.image} and script {x.options.script} are placeholders: set them with the "
        f"export's image and script options (the operator picks the master address and port)",
    ]
    text = comment(header) + "\n" + to_yaml(manifest) + "\n"
    return Export("kubernetes", "application/yaml", "pytorchjob.yaml", text)
