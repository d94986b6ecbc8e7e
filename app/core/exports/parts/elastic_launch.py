"""The elastic form of the launch exports (torchrun, slurm): `--nnodes MIN:MAX`, a c10d
rendezvous and `--max-restarts`, so that torchrun's agent restarts the workers on the nodes
that are left when one is lost, and the python skeleton resumes from its checkpoint on the new
world size (its elastic table, app.core.exports.parts.elastic_table).

c10d keeps the rendezvous store in the agent at the rendezvous endpoint (the first node): the
run survives the loss of any other node, not of that one. Only even plans launch elastically:
an uneven plan's shares follow the throughputs of the nodes it was planned for.
"""

from __future__ import annotations

from app.core.errors.domain import InvalidValue
from app.core.exports.parts.common import num_nodes, uniform_gpus_per_node
from app.core.exports.parts.elastic_table import elastic_table
from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.parts.shell import c10d_rendezvous

POINTER = "/query/elastic_nodes"


def elastic_range(x: ExportInput) -> tuple[int, int]:
    """The launch's node range, checked: an even plan, MIN <= MAX, and the global batch kept on
    the fewest nodes' GPUs."""
    assert x.options.elastic is not None
    low, high = x.options.elastic
    if not 1 <= low <= high:
        raise InvalidValue(
            f"elastic_nodes {low}:{high} must be MIN:MAX with 1 <= MIN <= MAX (the plan has "
            f"{num_nodes(x)} nodes)",
            pointer=POINTER,
        )
    if x.plan.split != "even":
        raise ExportUnsupported(
            "an elastic launch restarts the run on the nodes that are left, and this plan's shares follow "
            "the throughput of each node it was planned for: launch it as planned, or plan an even split",
            pointer="/topology/node_groups",
        )
    per_node = uniform_gpus_per_node(x)
    if per_node is None:
        raise ExportUnsupported(
            "an elastic launch starts the same number of processes on every node, and these node groups "
            f"have {sorted({g.gpus_per_node for g in x.request.topology.node_groups})} GPUs per node",
            pointer="/topology/node_groups",
        )
    sizes = {e.data_parallel_size for e in elastic_table(x)}
    lost = [
        nodes
        for nodes in range(low, min(high, low + 64) + 1)
        if (nodes * per_node) % x.plan.model_parallel_size
        or (nodes * per_node) // x.plan.model_parallel_size not in sizes
    ]
    if lost:
        raise InvalidValue(
            f"on {lost[0]} nodes ({lost[0] * per_node} GPUs) the global batch of {x.plan.global_batch_size} "
            f"does not split into whole micro-batches (data-parallel sizes that keep it: {sorted(sizes)}): "
            f"narrow elastic_nodes to node counts whose GPUs keep it",
            pointer=POINTER,
        )
    return low, high


def elastic_args(x: ExportInput, rdzv_id: str) -> list[str]:
    """torchrun's rendezvous and restart options for the elastic launch."""
    return [
        "--max-restarts",
        str(x.options.max_restarts),
        *c10d_rendezvous(rdzv_id),
        # Once MIN nodes are in, wait this long for more before starting (a restart, too).
        "--rdzv-conf",
        "join_timeout=900,last_call_timeout=30",
    ]


def elastic_comment(x: ExportInput) -> list[str]:
    low, high = elastic_range(x)
    return [
        f"# Elastic: torchrun runs on {low} to {high} nodes. When a node is lost, the agents left",
        f"# restart their workers (up to {x.options.max_restarts} times) on the nodes that are left, and the",
        "# python export's train.py resumes from its checkpoint (--checkpoint, on storage every node",
        "# shares) with the micro-batch and accumulation that keep the global batch there",
        "# (docs/resume.md). The rendezvous store lives in the agent at MASTER_ADDR: losing that node",
        "# ends the run.",
    ]
