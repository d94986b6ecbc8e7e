"""`slurm`: an sbatch script with one task per node, each running torchrun. Node groups of
different shapes, or pinned (uneven) ranks, become a heterogeneous job, one component per
node group."""

from __future__ import annotations

import shlex

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    node_groups,
    num_nodes,
    pinned_ranks,
    summary,
    uniform_gpus_per_node,
)
from app.core.exports.mesh_env import mesh_export_lines
from app.core.exports.shell import batch_env, c10d_rendezvous, shell_line, torchrun_args


def export_slurm(x: ExportInput) -> Export:
    groups = node_groups(x)
    shape = uniform_gpus_per_node(x)
    het = shape is None or pinned_ranks(x)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={shlex.quote(x.options.job_name)}"]
    if not het:
        lines += [
            f"#SBATCH --nodes={num_nodes(x)}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={shape}",
        ]
    else:
        for i, g in enumerate(groups):
            if i:
                lines.append("#SBATCH hetjob")
            lines += [
                f"#SBATCH --nodes={g.num_nodes}",
                "#SBATCH --ntasks-per-node=1",
                f"#SBATCH --gpus-per-node={g.gpus_per_node}",
                f"# component {i}: {g.name} nodes (add --constraint or --partition to place them)",
            ]
    lines += [
        "#SBATCH --output=%x-%j.out",
        comment(summary(x)),
        "# One task per node runs torchrun, which starts one process per GPU.",
        "set -euo pipefail",
        *batch_env(x),
        *mesh_export_lines(x.plan),
        f"MASTER_PORT={x.options.port}",
    ]
    if not het:
        lines += [
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_ADDR MASTER_PORT",
            "srun --kill-on-bad-exit=1 "
            + shell_line(
                torchrun_args(
                    x,
                    nnodes='"$SLURM_NNODES"',
                    nproc=str(shape),
                    rendezvous=c10d_rendezvous('"$SLURM_JOB_ID"'),
                )
            ),
        ]
    else:
        lines += _heterogeneous_step(x)
    return Export("slurm", "text/plain", "job.sbatch", "\n".join(lines) + "\n")


def _heterogeneous_step(x: ExportInput) -> list[str]:
    # A heterogeneous step numbers its tasks across components in order, one task per
    # node here, so SLURM_PROCID is the node rank in node-group order. It is read inside
    # each task (single quotes), not when the batch script runs.
    steps = []
    for i, g in enumerate(node_groups(x)):
        inner = " ".join(
            [
                "exec torchrun",
                f"--nnodes {num_nodes(x)}",
                f"--nproc-per-node {g.gpus_per_node}",
                '--node-rank "$SLURM_PROCID"',
                '--master-addr "$MASTER_ADDR"',
                '--master-port "$MASTER_PORT"',
                shlex.quote(x.options.script),
            ]
        )
        steps.append(f"--het-group={i} bash -c {shlex.quote(inner)}")
    return [
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n 1)"',
        "export MASTER_ADDR MASTER_PORT",
        "srun --kill-on-bad-exit=1 " + " \\\n  : ".join(steps),
    ]
