"""`megatron`: Megatron-LM's command-line arguments as a bash array, to pass to
`pretrain_gpt.py` (or any Megatron training script) under torchrun. Megatron derives the
data-parallel size itself (world size / (tensor x pipeline x context)) and the number of
micro-batches as global / (micro x data-parallel size), changing with `--rampup-batch-size`
as app.core.schedule replays it.
"""

from __future__ import annotations

import dataclasses

from app.core.errors import PlanError
from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    num_nodes,
    require_even,
    summary,
    uniform_gpus_per_node,
)
from app.core.exports.training import optimizer_settings
from app.core.schedule import Rampup, ScheduleSpec, schedule

# Megatron's optimizers (--optimizer); its adam is AdamW-style, the same at weight decay 0.
_OPTIMIZERS = {"adam": "adam", "adamw": "adam", "sgd": "sgd"}


def _rampup_samples(x: ExportInput, steps: int) -> int:
    """Samples consumed by the first `steps` optimizer steps of the ramp (Megatron counts
    warmup in samples once the batch ramps)."""
    assert x.options.rampup is not None
    try:
        ran = schedule(
            x.plan, ScheduleSpec(train_steps=max(steps, 1), rampup=Rampup(*x.options.rampup), max_points=2)
        )
    except PlanError as err:
        raise dataclasses.replace(err, pointer="/rampup_batch_size") from None
    return ran.train_samples if steps else 0


def megatron_args(x: ExportInput) -> tuple[list[tuple[str, ...]], list[str]]:
    """(flag and its values) in order, and the notes written above them."""
    require_even(x, "Megatron-LM", "takes one --micro-batch-size for every rank")
    p, parallel = x.plan, x.request.parallelism
    assert p.micro_batch_size is not None
    notes: list[str] = []
    args: list[tuple[str, ...]] = [
        ("--micro-batch-size", str(p.micro_batch_size)),
        ("--global-batch-size", str(p.global_batch_size)),
    ]
    if x.request.sequence_length is not None:
        args.append(("--seq-length", str(x.request.sequence_length)))
    else:
        notes.append("no sequence_length in the plan: add --seq-length (and --max-position-embeddings)")
    args += [
        ("--tensor-model-parallel-size", str(parallel.tensor)),
        ("--pipeline-model-parallel-size", str(parallel.pipeline)),
        ("--context-parallel-size", str(parallel.context)),
    ]
    ramp = x.options.rampup
    if ramp is not None:
        _rampup_samples(x, 1)  # refuses a ramp whose stages do not split into micro-batches
        args.append(("--rampup-batch-size", *(str(v) for v in ramp)))
    total = p.sampler.total_optimizer_steps if p.sampler else None
    if total:
        # Megatron trains a ramp by samples only (--train-iters is refused with a ramp).
        args.append(
            ("--train-samples", str(_rampup_samples(x, total))) if ramp else ("--train-iters", str(total))
        )
    if x.request.loss_normalization.value == "token":
        args.append(("--calculate-per-token-loss",))
    lr, o = p.learning_rate, optimizer_settings(x)
    if lr is not None and o is not None:
        args += [("--lr", repr(lr.lr)), ("--lr-decay-style", "constant")]
        if lr.warmup_steps:
            warmup = (
                ("--lr-warmup-samples", str(_rampup_samples(x, lr.warmup_steps)))
                if ramp
                else ("--lr-warmup-iters", str(lr.warmup_steps))
            )
            args += [warmup, ("--lr-warmup-init", repr(lr.warmup_start_lr))]
        if o.name in _OPTIMIZERS:
            args += [("--optimizer", _OPTIMIZERS[o.name]), ("--weight-decay", "0.0")]
            if o.momentum is not None:
                args.append(("--sgd-momentum", repr(o.momentum)))
            if o.betas is not None:
                args += [("--adam-beta1", repr(o.betas[0])), ("--adam-beta2", repr(o.betas[1]))]
                args.append(("--adam-eps", repr(o.eps)))
        else:
            notes.append(f"Megatron has no {o.name} optimizer: choose --optimizer yourself")
    return args, notes


def export_megatron(x: ExportInput) -> Export:
    args, notes = megatron_args(x)
    gpus = uniform_gpus_per_node(x)
    launch = (
        f"torchrun --nnodes {num_nodes(x)} --nproc-per-node {gpus if gpus is not None else 'gpu'} "
        f'<rendezvous> pretrain_gpt.py "${{MEGATRON_ARGS[@]}}" <model and data arguments>'
    )
    lines = [
        "#!/usr/bin/env bash",
        comment(summary(x) + [f"note: {n}" for n in notes]),
        f"# Megatron derives data-parallel size {x.plan.data_parallel_size} = {x.plan.world_size} GPUs / "
        f"(tensor x pipeline x context) = {x.plan.model_parallel_size}.",
        "MEGATRON_ARGS=(",
        *(f"  {' '.join(a)}" for a in args),
        ")",
        f"# {launch}",
    ]
    return Export("megatron", "text/plain", "megatron_args.sh", "\n".join(lines) + "\n")
