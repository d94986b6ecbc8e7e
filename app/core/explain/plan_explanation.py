"""Short sentences that walk a person through the plan, with its own numbers."""

from __future__ import annotations

from app.core.learning_rate.evidence import lr_evidence_sentences
from app.core.learning_rate.noise_scale import readable
from app.core.records.plan import BatchEfficiency, DeviceMeshPlan, LearningRatePlan, ReplicaGroup, SamplerPlan
from app.core.records.plan_request import LossReduction, Parallelism
from app.core.records.record import record

_MAX_LISTED = 4


@record
class BatchSplit:
    """How the global batch is shared out: what both the split's and the loss scales' sentences
    read."""

    dp: int
    global_batch: int
    accumulation: int
    groups: tuple[ReplicaGroup, ...]
    common_micro: int | None  # every replica's micro-batch, when they share one
    stream: bool = False  # a stream's loaders take no sampler: app.core.explain.stream says how


def _ranks(g: ReplicaGroup) -> str:
    return f"rank {g.start}" if g.count == 1 else f"ranks {g.start}-{g.stop - 1}"


# Keyword-only, one per part of the plan the sentences read: a record of them all would be the
# Plan being built, which the planner assembles after the explanation.
def explain(
    *,
    world: int,
    parallelism: Parallelism,
    split: BatchSplit,
    reduction: LossReduction,
    sampler: SamplerPlan | None,
    lr: LearningRatePlan | None,
    by_throughput: bool,
    efficiency: BatchEfficiency | None = None,
    sequence_length: int | None = None,
    wrapper: str = "ddp",
) -> list[str]:
    mp = parallelism.model_parallel_size
    dp, global_batch, accumulation = split.dp, split.global_batch, split.accumulation
    out = [
        f"{world} GPUs in model-parallel groups of tensor {parallelism.tensor} x pipeline "
        f"{parallelism.pipeline} x context {parallelism.context} = {mp} give {dp} "
        f"data-parallel replicas; the batch is split over replicas, not over GPUs."
    ]
    out += _split_sentences(split, by_throughput)[: 1 if split.stream else None]
    if accumulation > 1:
        out.append(
            f"Run the first {accumulation - 1} of every {accumulation} micro-batches inside "
            f"model.no_sync(), so DDP all-reduces once per optimizer step, then step the "
            f"optimizer."
        )
    out += _scale_sentences(split, reduction, parallelism, wrapper)
    if lr is not None:
        out += _learning_rate_sentences(lr, global_batch, sequence_length)
        out += lr_evidence_sentences(lr, global_batch, sequence_length)  # measured or assumed (issue 39)
    if sampler is not None and sampler.shuffle:
        out.append(
            f"Call sampler.set_epoch(epoch) before every epoch: the sampler shuffles with "
            f"seed + epoch ({sampler.seed} + epoch), and without it every epoch repeats one "
            f"order."
        )
    if sampler is not None:
        out.append(
            f"One epoch is {sampler.micro_steps_per_epoch} micro-steps and "
            f"{sampler.optimizer_steps_per_epoch} optimizer steps per replica."
        )
    if efficiency is not None:
        out.append(_efficiency_sentence(efficiency, global_batch))
    return out


def _split_sentences(split: BatchSplit, by_throughput: bool) -> list[str]:
    """How the batch is split, and how each process builds its loader for it."""
    dp, global_batch, accumulation = split.dp, split.global_batch, split.accumulation
    groups, common_micro = split.groups, split.common_micro
    per_step = global_batch // accumulation
    if common_micro is not None:
        # DataParallel's loader batch is one micro-step over all GPUs: the whole batch only
        # without accumulation.
        data_parallel = (
            f"the whole batch per step, {per_step}"
            if accumulation == 1
            else f"one micro-step's batch, {common_micro} x {dp} = {per_step}, and {accumulation} "
            f"accumulated micro-steps make the global batch of {global_batch}"
        )
        return [
            f"Each replica takes a micro-batch of {common_micro} and "
            f"accumulates {accumulation} per optimizer step: {common_micro} x {accumulation} x "
            f"{dp} = {global_batch}, the global batch.",
            f"Under DistributedDataParallel every process builds its own loader: "
            f"DataLoader(dataset, batch_size={common_micro}, sampler=DistributedSampler(dataset, "
            f"num_replicas={dp}, rank=data_parallel_rank)). Under DataParallel one process "
            f"feeds all GPUs, so there batch_size is {data_parallel}.",
        ]
    listed = ", ".join(
        f"{_ranks(g)} ({g.node_group}) take {g.micro_batch_size}" for g in groups[:_MAX_LISTED]
    )
    more = f", and {len(groups) - _MAX_LISTED} more groups" if len(groups) > _MAX_LISTED else ""
    basis = "throughput" if by_throughput else "equal shares, largest remainder first"
    return [
        f"Each micro-step's {per_step} samples are shared out by {basis}: {listed}{more}; "
        f"every replica accumulates {accumulation} micro-batch{'es' if accumulation > 1 else ''}, "
        f"{global_batch} samples "
        f"in all.",
        "Under DistributedDataParallel each rank builds its loader with its own "
        "batch_size from replica_groups and the proportional sampler, so every rank runs "
        "the same number of micro-steps and no rank waits at the all-reduce.",
    ]


def _scale_sentences(
    split: BatchSplit, reduction: LossReduction, parallelism: Parallelism, wrapper: str
) -> list[str]:
    """What each micro-batch's loss is multiplied by, and why."""
    dp, global_batch, accumulation = split.dp, split.global_batch, split.accumulation
    groups, common_micro = split.groups, split.common_micro
    # No scales under loss_normalization token: app.core.tokens.token_plan explains what each rank does.
    scales = sorted({g.loss_scale for g in groups if g.loss_scale is not None})
    if not scales:
        return []
    scale_text = f"{scales[0]:g}" if len(scales) == 1 else f"{scales[0]:g} to {scales[-1]:g}"
    if reduction is LossReduction.SUM:
        return [
            f"Losses are summed, so multiply each micro-batch loss by data_parallel_size / "
            f"global batch ({dp}/{global_batch} = {scale_text}): DDP's mean over {dp} replicas "
            f"then equals the gradient of the mean loss over all {global_batch} samples."
        ]
    if common_micro is None:
        micros = sorted({g.micro_batch_size for g in groups})
        return [
            f"Each process's loss is a mean over its own micro-batch ({micros[0]} to "
            f"{micros[-1]} samples here) and DDP's all-reduce averages the {dp} replicas' "
            f"gradients with equal weights, so a mean of these unequal-size means is not the "
            f"mean over all {global_batch} samples: multiplying each replica's mean loss by "
            f"data_parallel_size x its micro-batch / global batch ({scale_text} here) makes the "
            f"average exactly the gradient of the mean loss over all {global_batch} samples."
        ]
    out = []
    if accumulation > 1:
        out.append(
            f"Multiply each micro-batch's mean loss by loss_scale = 1/{accumulation} = "
            f"{scale_text}, so the accumulated gradient is a mean over the step, not a sum."
        )
    if dp > 1:
        # The sentence a newcomer came for: why DDP's average of per-process means is right.
        per_replica = common_micro * accumulation
        of_micro = f" ({accumulation} micro-batches of {common_micro})" if accumulation > 1 else ""
        # The mesh's wrapper (app.core.cluster.device_mesh): FSDP and HSDP average the same replicas
        # with a reduce-scatter instead of an all-reduce.
        averaging = "DDP's all-reduce" if wrapper == "ddp" else "FSDP's reduce-scatter"
        one = "one GPU" if parallelism.model_parallel_size == 1 else "one model replica"
        out.append(
            f"Each process's loss is a mean over its {per_replica} samples{of_micro}, "
            f"{averaging} averages the {dp} replicas' gradients, and a mean of {dp} equal-size "
            f"means is the mean over all {global_batch} samples: the gradient of {one} with a "
            f"batch of {global_batch}. With unequal micro-batches it is not, which is what the "
            f"loss scales of an uneven plan fix."
        )
    return out


def _learning_rate_sentences(
    lr: LearningRatePlan, global_batch: int, sequence_length: int | None
) -> list[str]:
    ratio = f"{global_batch}/{lr.base_batch_size}"
    if lr.base_batch_tokens is not None and sequence_length is not None:
        ratio = f"{global_batch * sequence_length}/{lr.base_batch_tokens} tokens"
    # Only the sentence of the rule in force is written.
    if lr.rule == "linear":
        law = f"linear rule {lr.base_lr:g} x {ratio}"
    elif lr.rule == "sqrt":
        law = f"square-root rule {lr.base_lr:g} x sqrt({ratio})"
    elif lr.rule == "none":
        law = "no scaling"
    else:
        raise KeyError(lr.rule)
    text = (
        f"DDP's gradient is a mean over the global batch of {global_batch}, so the "
        f"learning rate is scaled against that, not against one GPU's micro-batch: "
        f"{law} = {lr.lr:g}"
    )
    if lr.warmup_steps:
        text += (
            f", warmed up linearly from {lr.warmup_start_lr:g} over {lr.warmup_steps} "
            f"optimizer steps (Goyal et al. 2017)"
        )
    out = [text + "."]
    if lr.adam is not None:
        out.append(
            f"For {lr.optimizer} the square-root rule also moves beta1 to {lr.adam.beta1:g}, "
            f"beta2 to {lr.adam.beta2:g} and eps to {lr.adam.eps:g} (Malladi et al. 2022)."
        )
    return out


def _efficiency_sentence(e: BatchEfficiency, global_batch: int) -> str:
    noise = readable(e.gradient_noise_scale)
    if e.gradient_noise_scale_stderr:
        noise += f" +/- {readable(e.gradient_noise_scale_stderr)}"
    return (
        f"A gradient noise scale of {noise} samples puts the critical batch near "
        f"{readable(e.critical_batch_size)} (McCandlish et al. 2018: (S/S_min - 1)(E/E_min - 1) "
        f"= 1): global batch {global_batch} needs {readable(e.steps_vs_min)}x the fewest "
        f"possible optimizer steps and {readable(e.samples_vs_min)}x the fewest possible "
        f"samples, a step efficiency of {readable(e.step_efficiency * 100)}% and a sample "
        f"efficiency of {readable(e.sample_efficiency * 100)}%."
    )


def mesh_sentences(mesh: DeviceMeshPlan, dp: int) -> list[str]:
    """The mesh and who shares samples: only where the mesh is more than plain DDP."""
    if mesh.wrapper == "ddp" and mesh.data_parallel_dimensions == tuple(d.name for d in mesh.dimensions):
        return []
    shape = " x ".join(f"{d.name} {d.size}" for d in mesh.dimensions)
    group = " x ".join(mesh.data_parallel_dimensions) or "a single replica"
    # torchtitan's FSDP shards over dp_shard x cp (its `fsdp` mesh): context-parallel ranks
    # hold one replica's shards.
    sharded = [d for d in mesh.dimensions if d.name in ("dp_shard", "cp")]
    shard_group = " x ".join(d.name for d in sharded)
    shard_ranks = mesh.data_parallel_shard * next((d.size for d in sharded if d.name == "cp"), 1)
    wrapped = mesh.wrapper.upper()
    if "cp" in shard_group:
        wrapped += f", sharded over {shard_group} ({shard_ranks} ranks)"
    out = [
        f"The device mesh is {shape} ({mesh.init_device_mesh}); the data-parallel group is "
        f"{group}, {dp} ranks wide, and the model is wrapped as {wrapped}."
    ]
    out.append(
        f"The sampler's num_replicas and rank are the data-parallel ones (num_replicas={dp}, "
        f"rank = the rank's coordinate in {group}), never the global world size and rank: "
        f"tensor-, pipeline- and context-parallel peers must read the same samples."
    )
    if mesh.wrapper == "hsdp":
        out.append(
            f"Under HSDP the shard group ({shard_group}, {shard_ranks} ranks) is not the "
            + (
                f"data-parallel group: num_replicas is {dp}, not {shard_ranks}."
                if shard_ranks != dp
                else f"data-parallel group: num_replicas is {dp} either way, but the rank is the "
                f"coordinate in {group}, not in the shard group."
            )
        )
    return out
