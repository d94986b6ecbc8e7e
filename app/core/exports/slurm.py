"""`slurm`: an sbatch script with one task per node, each running torchrun. Node groups of
different shapes, or pinned (uneven) ranks, become a heterogeneous job, one component per
node group.

Each task gets --cpus-per-task for all its node's ranks, passed to srun too (srun 22.05 no
longer takes it from sbatch). The rendezvous port is derived from the job id, so two jobs
sharing a node do not join one rendezvous. Job-wide options come before the first `hetjob`
line: after it they would apply to the last component only.
"""

from __future__ import annotations

import shlex

from app.core.exports.parts.common import (
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
    batch_env,
    c10d_rendezvous,
    elastic_batch_env,
    setup_lines,
    shell_line,
    shell_words,
    torchrun_args,
)

# Ports the rendezvous may take above the export's port, one per job id modulo this.
PORT_SPAN = 10000


def export_slurm(x: ExportInput) -> Export:
    groups = node_groups(x)
    shape = uniform_gpus_per_node(x)
    het = shape is None or pinned_ranks(x)
    elastic = x.options.elastic is not None
    if elastic:
        elastic_range(x)  # refuses what cannot launch elastically, before anything is written
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={shlex.quote(x.options.job_name)}",
        "#SBATCH --output=%x-%j.out",
    ]
    if elastic:
        # Slurm would otherwise end the job when one of its nodes fails.
        lines.append("#SBATCH --no-kill")
    for i, g in enumerate(groups if het else groups[:1]):
        if i:
            lines.append("#SBATCH hetjob")
        if het:
            lines.append(f"# component {i}: {g.name} nodes (add --constraint or --partition to place them)")
        lines += [
            f"#SBATCH --nodes={g.num_nodes if het else num_nodes(x)}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={g.gpus_per_node}",
            f"#SBATCH --cpus-per-task={_cpus(x, g.gpus_per_node)}",
        ]
    span = min(PORT_SPAN, 65536 - x.options.port)
    first_nodes = "$SLURM_JOB_NODELIST_HET_GROUP_0" if het else "$SLURM_JOB_NODELIST"
    lines += [
        summary_comment(x),
        "# One task per node runs torchrun, which starts one process per GPU.",
        "set -euo pipefail",
        *setup_lines(x),
        *(elastic_batch_env(x) if elastic else batch_env(x)),
        *mesh_export_lines(x.plan),
        *(elastic_comment(x) if elastic else []),
        *([f'ELASTIC_NNODES="{elastic_range(x)[0]}:$SLURM_NNODES"'] if elastic else []),
        "# A port per job: two jobs sharing a node must not meet in one rendezvous.",
        f"MASTER_PORT=$(( {x.options.port} + SLURM_JOB_ID % {span} ))",
        # sed reads the whole list: `head -n 1` would close the pipe early, and scontrol, killed
        # by SIGPIPE on a long node list, would fail the script under pipefail.
        f'MASTER_ADDR="$(scontrol show hostnames "{first_nodes}" | sed -n 1p)"',
        "export MASTER_ADDR MASTER_PORT",
    ]
    step = _heterogeneous_step if het else _step
    if x.options.preflight:
        lines += preflight_lines(x, step(x, check_args(x)))
    lines.append(step(x, [x.options.script]))
    return Export("slurm", "text/plain", "job.sbatch", "\n".join(lines) + "\n")


def _cpus(x: ExportInput, gpus: int) -> int:
    return gpus * x.options.cpus_per_gpu


def _srun(x: ExportInput, gpus: int, elastic: bool = False) -> str:
    # --export=ALL: under `sbatch --export=NONE` srun would pass the steps no environment. An
    # elastic step keeps running when one node's task dies: torchrun restarts on the rest.
    kill = "" if elastic else " --kill-on-bad-exit=1"
    return f"--export=ALL{kill} --cpus-per-task={_cpus(x, gpus)}"


def _step(x: ExportInput, program: list[str]) -> str:
    shape = uniform_gpus_per_node(x) or 1
    elastic = x.options.elastic is not None and program == [x.options.script]
    if elastic:
        nnodes, rendezvous = '"$ELASTIC_NNODES"', elastic_args(x, '"$SLURM_JOB_ID"')
    else:
        nnodes, rendezvous = '"$SLURM_NNODES"', c10d_rendezvous('"$SLURM_JOB_ID"')
    torchrun = torchrun_args(x, nnodes=nnodes, nproc=str(shape), rendezvous=rendezvous, program=program)
    return f"srun {_srun(x, shape, elastic)} " + shell_line(torchrun)


def _heterogeneous_step(x: ExportInput, program: list[str]) -> str:
    # A heterogeneous step numbers its tasks across components in order, one task per
    # node here, so SLURM_PROCID is the node rank in node-group order. It is read inside
    # each task (single quotes), not when the batch script runs.
    steps = []
    for i, g in enumerate(node_groups(x)):
        inner = "exec " + shell_words(
            torchrun_args(
                x,
                nnodes=str(num_nodes(x)),
                nproc=str(g.gpus_per_node),
                rendezvous=[
                    "--node-rank",
                    '"$SLURM_PROCID"',
                    "--master-addr",
                    '"$MASTER_ADDR"',
                    "--master-port",
                    '"$MASTER_PORT"',
                ],
                program=program,
            )
        )
        steps.append(f"--het-group={i} {_srun(x, g.gpus_per_node)} bash -c {shlex.quote(inner)}")
    return "srun " + " \\\n  : ".join(steps)
