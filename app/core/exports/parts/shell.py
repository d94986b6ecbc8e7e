"""Shell pieces of the launch scripts (torchrun, Slurm): the torchrun command line, its
quoting, and the batch-size environment block."""

from __future__ import annotations

import shlex

from app.core.exports.parts.export_types import ExportInput


def torchrun_args(
    x: ExportInput, *, nnodes: str, nproc: str, rendezvous: list[str], program: list[str] | None = None
) -> list[str]:
    """`program`: what torchrun starts instead of the training script (the preflight's check)."""
    return [
        "torchrun",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        nproc,
        *rendezvous,
        *(program if program is not None else [x.options.script]),
    ]


def shell_words(args: list[str]) -> str:
    """Words on one line, quoted as `shell_line` quotes them."""
    return " ".join(a if a.startswith('"$') else shlex.quote(a) for a in args)


# Why the job's environment is activated in the script, by where the script runs.
SBATCH_SHELL = (
    "# The job's environment: nothing of the submitting shell is inherited under",
    "# sbatch --export=NONE. Activate yours here (or export with the setup option), e.g.",
)
LOCAL_SHELL = ("# The job's environment: activate yours here (or export with the setup option), e.g.",)
NODE_SHELLS = (
    "# The job's environment: each node runs this script in a shell of its own (ssh, a",
    "# scheduler), which inherits nothing of yours. Activate it here (or export with the",
    "# setup option), e.g.",
)


def setup_lines(x: ExportInput, why: tuple[str, ...] = SBATCH_SHELL) -> list[str]:
    """The line that activates the job's environment: the export's `setup`, or where it goes,
    with `why` it is needed where the script runs (under `sbatch --export=NONE`, or a fresh
    ssh session on each node, nothing of the submitting shell is inherited)."""
    if x.options.setup:
        return ["# The job's environment (the export's setup option):", x.options.setup]
    return [*why, "#   source /path/to/venv/bin/activate"]


def c10d_rendezvous(rdzv_id: str) -> list[str]:
    """torchrun's dynamic rendezvous at $MASTER_ADDR:$MASTER_PORT: nodes get their ranks in
    the order they join."""
    return [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        '"$MASTER_ADDR:$MASTER_PORT"',
        "--rdzv-id",
        rdzv_id,
    ]


def shell_line(args: list[str], indent: str = "") -> str:
    """A shell command, one option per line. Words starting with `"$` are already quoted
    shell expressions; everything else is quoted for the shell."""
    words = [a if a.startswith('"$') else shlex.quote(a) for a in args]
    parts, i = [words[0]], 1
    while i < len(words):
        # An option and its value share a line (`-m module` too).
        if (
            (words[i].startswith("--") or words[i] == "-m")
            and i + 1 < len(words)
            and not words[i + 1].startswith("--")
        ):
            parts.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            parts.append(words[i])
            i += 1
    return (" \\\n" + indent + "  ").join(parts)


def batch_env(x: ExportInput) -> list[str]:
    p = x.plan
    if p.micro_batch_size is None:
        return ["# Per-rank micro-batches differ: the training script reads them from its replica table."]
    return [
        f"export GLOBAL_BATCH_SIZE={p.global_batch_size} MICRO_BATCH_SIZE={p.micro_batch_size} "
        f"GRADIENT_ACCUMULATION_STEPS={p.gradient_accumulation_steps}"
    ]


def elastic_batch_env(x: ExportInput) -> list[str]:
    """An elastic launch exports only the global batch: the micro-batch and accumulation follow
    the world size the run is restarted on (the python skeleton's elastic table)."""
    return [
        "# Elastic: the micro-batch and accumulation follow the world size; the global batch is kept.",
        f"export GLOBAL_BATCH_SIZE={x.plan.global_batch_size}",
    ]
