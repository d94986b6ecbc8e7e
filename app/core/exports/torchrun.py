"""`torchrun`: a bash launch script, run on every node. It carries uneven plans too: when a
rank's share depends on its node, nodes are numbered in node-group order (static
rendezvous)."""

from __future__ import annotations

from collections.abc import Callable

from app.core.exports.parts.common import (
    NodeGroup,
    node_groups,
    num_nodes,
    pinned_ranks,
    summary_comment,
    uniform_gpus_per_node,
)
from app.core.exports.parts.elastic_launch import elastic_args, elastic_comment, elastic_range
from app.core.exports.parts.export_types import Export, ExportInput
from app.core.exports.parts.mesh_env import mesh_export_lines
from app.core.exports.parts.preflight import check_args, preflight_lines
from app.core.exports.parts.shell import (
    LOCAL_SHELL,
    NODE_SHELLS,
    batch_env,
    c10d_rendezvous,
    elastic_batch_env,
    setup_lines,
    shell_line,
    torchrun_args,
)

# The torchrun line of a launch, given what it starts (the training script or the preflight).
Launch = Callable[[list[str]], str]


def export_torchrun(x: ExportInput) -> Export:
    groups = node_groups(x)
    nodes = num_nodes(x)
    elastic = x.options.elastic is not None
    shells = LOCAL_SHELL if nodes == 1 and not elastic else NODE_SHELLS
    head = [
        "#!/usr/bin/env bash",
        summary_comment(x),
        "set -euo pipefail",
        *setup_lines(x, shells),
        *(elastic_batch_env(x) if elastic else batch_env(x)),
    ]
    head += mesh_export_lines(x.plan)
    launch: Launch
    if x.options.elastic is not None:
        body, launch = _elastic(x, nodes)
    elif nodes == 1:
        body = ["# Single node: every GPU of this machine, rendezvous on localhost."]
        nproc = str(groups[0].gpus_per_node)
        launch = lambda program: shell_line(  # noqa: E731
            torchrun_args(x, nnodes="1", nproc=nproc, rendezvous=["--standalone"], program=program)
        )
    elif not pinned_ranks(x):
        body, launch = _any_node_order(x, nodes)
    else:
        body, launch = _node_group_order(x, groups, nodes)
    if x.options.preflight:
        body += preflight_lines(x, launch(check_args(x, every_node=nodes > 1 or elastic)))
    body.append(launch([x.options.script]))
    return Export("torchrun", "text/plain", "launch.sh", "\n".join(head + body) + "\n")


def _elastic(x: ExportInput, nodes: int) -> tuple[list[str], Launch]:
    low, high = elastic_range(x)
    shape = uniform_gpus_per_node(x)
    nproc = str(shape) if shape is not None else "gpu"
    body = [
        *elastic_comment(x),
        f"# Run this same script on each node (the plan has {nodes}); MASTER_ADDR is the first node's.",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node, the same on every node}"',
        f'MASTER_PORT="${{MASTER_PORT:-{x.options.port}}}"',
    ]
    rendezvous = elastic_args(x, '"${RDZV_ID:-batchplan}"')
    # The preflight checks the plan on its own nodes; training runs on whatever is left.
    fixed = c10d_rendezvous('"${RDZV_ID:-batchplan}-preflight"')

    def launch(program: list[str]) -> str:
        training = program == [x.options.script]
        return shell_line(
            torchrun_args(
                x,
                nnodes=f"{low}:{high}" if training else str(nodes),
                nproc=nproc,
                rendezvous=rendezvous if training else fixed,
                program=program,
            )
        )

    return body, launch


def _any_node_order(x: ExportInput, nodes: int) -> tuple[list[str], Launch]:
    shape = uniform_gpus_per_node(x)
    nproc = str(shape) if shape is not None else "gpu"
    body = [
        f"# Multi-node: run this same script on each of the {nodes} nodes. The c10d rendezvous",
        "# numbers the nodes as they join; MASTER_ADDR is any one node, the same everywhere.",
    ]
    if shape is None:
        body.append("# Node groups differ in GPUs per node: each node starts one process per local GPU.")
    body += [
        ': "${MASTER_ADDR:?set MASTER_ADDR to the address of one node, the same on every node}"',
        f'MASTER_PORT="${{MASTER_PORT:-{x.options.port}}}"',
    ]
    rendezvous = c10d_rendezvous('"${RDZV_ID:-batchplan}"')
    return body, lambda program: shell_line(
        torchrun_args(x, nnodes=str(nodes), nproc=nproc, rendezvous=rendezvous, program=program)
    )


def _node_group_order(x: ExportInput, groups: list[NodeGroup], nodes: int) -> tuple[list[str], Launch]:
    body = [
        f"# Multi-node with uneven shares: run this script on each of the {nodes} nodes with",
        "# NODE_RANK set. Ranks are numbered in node-group order, so each node's GPUs get the",
        "# micro-batch planned for them; static rendezvous keeps that order (c10d would number",
        "# nodes as they join).",
    ]
    for g in groups:
        body.append(f"#   NODE_RANK {g.first_node}-{g.first_node + g.num_nodes - 1}: {g.name} nodes")
    body += [
        ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the node with NODE_RANK 0}"',
        ': "${NODE_RANK:?set NODE_RANK to this node index, in node-group order}"',
        f'MASTER_PORT="${{MASTER_PORT:-{x.options.port}}}"',
    ]
    for i, g in enumerate(groups):
        keyword = "if" if i == 0 else "elif"
        body.append(
            f'{keyword} [ "$NODE_RANK" -lt {g.first_node + g.num_nodes} ]; then NPROC={g.gpus_per_node}'
        )
    body.append(f'else echo "NODE_RANK must be below {nodes}" >&2; exit 2; fi')
    rendezvous = [
        "--node-rank",
        '"$NODE_RANK"',
        "--master-addr",
        '"$MASTER_ADDR"',
        "--master-port",
        '"$MASTER_PORT"',
    ]
    return body, lambda program: shell_line(
        torchrun_args(x, nnodes=str(nodes), nproc='"$NPROC"', rendezvous=rendezvous, program=program)
    )
