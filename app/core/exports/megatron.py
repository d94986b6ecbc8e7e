"""`megatron`: Megatron-LM's command-line arguments as a bash array, to pass to
`pretrain_gpt.py` (or any Megatron training script) under torchrun. Megatron derives the
data-parallel size itself (world size / (tensor x pipeline x context)) and the number of
micro-batches as global / (micro x data-parallel size), changing with `--rampup-batch-size`
as app.core.learning_rate.schedule replays it.
"""

from __future__ import annotations

import dataclasses

from app.core.errors.domain import PlanError
from app.core.exports.parts.common import comment, num_nodes, require_even, summary, uniform_gpus_per_node
from app.core.exports.parts.export_types import Export, ExportInput, ExportUnsupported
from app.core.exports.parts.packed_tools import megatron_packed
from app.core.exports.parts.training import OptimizerSettings, optimizer_settings, run_length
from app.core.learning_rate.schedule import schedule
from app.core.records.plan import LearningRatePlan
from app.core.records.schedule import Rampup, ScheduleSpec

# Megatron's optimizers (--optimizer); its adam is AdamW-style, the same at weight decay 0.
_OPTIMIZERS = {"adam": "adam", "adamw": "adam", "sgd": "sgd"}


def _rampup_samples(x: ExportInput, steps: int) -> int:
    """Samples consumed by the first `steps` optimizer steps of the ramp (Megatron counts
    warmup in samples once the batch ramps)."""
    assert x.options.rampup is not None
    try:
        # The batches alone: the lr of a run cut short at `steps` is no concern here.
        batches = dataclasses.replace(x.plan, learning_rate=None)
        ran = schedule(
            batches, ScheduleSpec(train_steps=max(steps, 1), rampup=Rampup(*x.options.rampup), max_points=2)
        )
    except PlanError as err:
        raise dataclasses.replace(err, pointer="/rampup_batch_size") from None
    return ran.train_samples if steps else 0


def _optimizer_args(x: ExportInput, o: OptimizerSettings) -> list[tuple[str, ...]]:
    if o.name not in _OPTIMIZERS:
        raise ExportUnsupported(
            f"Megatron-LM has no {o.name} optimizer (--optimizer adam or sgd): choose adamw, adam or sgd",
            pointer="/learning_rate/optimizer",
        )
    if o.name == "adam" and o.weight_decay:
        raise ExportUnsupported(
            "Megatron's adam decouples the weight decay, as AdamW does; the plan's adam adds it to the "
            "gradient (torch's Adam): choose adamw",
            pointer="/learning_rate/optimizer",
        )
    if o.nesterov:
        raise ExportUnsupported(
            "Megatron's SGD has no Nesterov momentum (--sgd-momentum only): leave nesterov out",
            pointer="/learning_rate/nesterov",
        )
    args: list[tuple[str, ...]] = [("--optimizer", _OPTIMIZERS[o.name])]
    # Megatron's defaults are --weight-decay 0.01 and --clip-grad 1.0: stated, also when off.
    args += [("--weight-decay", repr(o.weight_decay))]
    args += [("--clip-grad", repr(o.max_grad_norm if o.max_grad_norm is not None else 0.0))]
    if o.momentum is not None:
        args.append(("--sgd-momentum", repr(o.momentum)))
    if o.betas is not None:
        args += [("--adam-beta1", repr(o.betas[0])), ("--adam-beta2", repr(o.betas[1]))]
        args.append(("--adam-eps", repr(o.eps)))
    return args


def _schedule_args(x: ExportInput, lr: LearningRatePlan, ramp: bool) -> list[tuple[str, ...]]:
    """Megatron's OptimizerParamScheduler: warmup while num_steps <= warmup from --lr-warmup-init,
    then --lr-decay-style to --min-lr at --lr-decay-iters (the plan's last step)."""
    if lr.decay == "step":
        raise ExportUnsupported(
            "Megatron-LM has no step decay (--lr-decay-style constant, linear, cosine, "
            "inverse-square-root or WSD): choose cosine or linear decay",
            pointer="/learning_rate/decay",
        )
    if lr.warmup_steps and lr.warmup_start_lr > lr.lr:
        raise ExportUnsupported(
            f"Megatron's warmup rises from --lr-warmup-init to --lr; the plan's falls from "
            f"{lr.warmup_start_lr!r} to {lr.lr!r}: set warmup_start_lr to at most {lr.lr!r}",
            pointer="/learning_rate/warmup_start_lr",
        )
    last = (lr.train_steps or 1) - 1
    decay = lr.decay if last > lr.warmup_steps else "constant"  # else the run ends before any decay
    args: list[tuple[str, ...]] = [("--lr", repr(lr.lr)), ("--lr-decay-style", decay)]
    if decay != "constant":
        args += [("--min-lr", repr(lr.min_lr))]
        args.append(
            ("--lr-decay-samples", str(_rampup_samples(x, last))) if ramp else ("--lr-decay-iters", str(last))
        )
    if lr.warmup_steps:
        warmup = (
            ("--lr-warmup-samples", str(_rampup_samples(x, lr.warmup_steps)))
            if ramp
            else ("--lr-warmup-iters", str(lr.warmup_steps))
        )
        args += [warmup, ("--lr-warmup-init", repr(lr.warmup_start_lr))]
    return args


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
    total = run_length(x)
    if total:
        # Megatron trains a ramp by samples only (--train-iters is refused with a ramp).
        args.append(
            ("--train-samples", str(_rampup_samples(x, total))) if ramp else ("--train-iters", str(total))
        )
    if x.request.loss_normalization.value == "token":
        args.append(("--calculate-per-token-loss",))
    packed_args, packed_notes = megatron_packed(x)
    args += packed_args
    notes += packed_notes
    lr, o = p.learning_rate, optimizer_settings(x)
    if lr is not None and o is not None:
        args += _optimizer_args(x, o)
        args += _schedule_args(x, lr, ramp is not None)
        if o.weight_decay:
            notes.append(
                "Megatron decays neither biases nor 1-D parameters (its default no_weight_decay_cond); "
                "the plan decays every parameter: pass no_wd_decay_cond=lambda name, param: False to "
                "setup_model_and_optimizer"
            )
        if ramp is not None and (lr.warmup_steps or lr.decay != "constant"):
            notes.append(
                "with --rampup-batch-size Megatron counts warmup and decay in samples: during the "
                "ramp its lr follows the samples consumed, not the plan's optimizer steps"
            )
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
