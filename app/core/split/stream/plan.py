"""The plan of a stream: how a sharded `IterableDataset` splits over the data-parallel ranks
and their DataLoader workers, what each rank delivers in an epoch, and what the end-of-epoch
policy trains of it, counted without a sample (stream_counts, stream_policy): a plan of
2**53 - 1 samples over a million shards costs milliseconds; a shard_samples list, or uneven
shards in a shuffled order, costs a pass over the shards (bounded in stream_layout).

`plan_stream` takes the request's stream and the batch the planner has solved: each data-
parallel rank's micro-batch (one for all, one per rank, or a mixed cluster's replica groups)
and the accumulation steps. stream_ids lists the same plan's sample ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

from app.core.errors.domain import InfeasiblePlan, InvalidValue
from app.core.records.plan import ReplicaGroup
from app.core.records.plan_request import LossNormalization, PackingMode, PlanRequest
from app.core.records.stream import ShortMicroBatch, StreamPlan, StreamRankGroup, StreamSpec
from app.core.split.stream import advice
from app.core.split.stream.checks import check_stream, refuse_empty_ranks
from app.core.split.stream.counts import Run, rank_runs
from app.core.split.stream.layout import total_samples
from app.core.split.stream.policy import micro_batches, micro_batches_run, short_positions, trained

MicroRun = tuple[int, int, int]  # ranks [start, stop) and their micro-batch size


def micro_batch_runs(
    data_parallel_size: int, micro_batch: int | Sequence[int] | Sequence[ReplicaGroup]
) -> list[MicroRun]:
    """Each rank's micro-batch size, in runs: one for all, one per rank, or replica groups'."""
    if isinstance(micro_batch, int):
        runs = [(0, data_parallel_size, micro_batch)]
    elif all(isinstance(m, ReplicaGroup) for m in micro_batch):
        groups = [m for m in micro_batch if isinstance(m, ReplicaGroup)]
        runs = sorted((g.start, g.stop, g.micro_batch_size) for g in groups)
    else:
        sizes = [m for m in micro_batch if isinstance(m, int)]
        runs = [(r, r + 1, b) for r, b in enumerate(sizes)]
    covered = [start for start, _, _ in runs] == [0, *(stop for _, stop, _ in runs[:-1])]
    if not covered or runs[-1][1] != data_parallel_size or min(b for _, _, b in runs) < 1:
        raise ValueError("one micro-batch size >= 1 for each data-parallel rank")
    return runs


def rank_groups(runs: list[Run], micro: list[MicroRun]) -> tuple[StreamRankGroup, ...]:
    """The ranks cut where their figures or their micro-batch change; equal neighbours merged."""
    bounds = sorted({*(run[0] for run in runs), *(m[0] for m in micro), runs[-1][1]})
    groups: list[StreamRankGroup] = []
    i = j = 0
    for low, high in pairwise(bounds):
        while runs[i][1] <= low:
            i += 1
        while micro[j][1] <= low:
            j += 1
        shards, samples = runs[i][2]
        b = micro[j][2]
        last = groups[-1] if groups else None
        if last and (last.worker_shards, last.worker_samples, last.micro_batch_size) == (shards, samples, b):
            groups[-1] = replace(last, stop=high)
            continue
        idle = sum(1 for n in shards if n == 0)
        count = micro_batches(samples, b)
        groups.append(StreamRankGroup(low, high, sum(shards), sum(samples), count, idle, b, shards, samples))
    return tuple(groups)


def with_short_micro_batches(group: StreamRankGroup, accumulation: int, counted: int) -> StreamRankGroup:
    """The group with the short micro-batches its ranks train (of the first `counted`)."""
    shorts = tuple(
        ShortMicroBatch(place, place // accumulation, worker, samples)
        for place, worker, samples in short_positions(group.worker_samples, group.micro_batch_size)
        if place < counted
    )
    return replace(group, short_micro_batches=shorts)


def loss_scale_formula(groups: tuple[StreamRankGroup, ...], dp: int, batch: int, reduction: str) -> str:
    """What each micro-batch's loss is multiplied by: the step's gradient is then the mean over
    the samples of the step, which the short micro-batches make fewer than the global batch."""
    head = (
        f"each micro-batch's mean loss x {dp} (data_parallel_size) x its samples"
        if reduction == "mean"
        else f"each micro-batch's summed loss x {dp} (data_parallel_size)"
    )
    if not any(g.short_micro_batches for g in groups):
        return f"{head} / {batch} (every micro-batch trained is full: each step holds the global batch)"
    return (
        f"{head} / the step's samples over all ranks: {batch} (the global batch), less, for each of "
        f"rank_groups[].short_micro_batches in the step, micro_batch_size - samples on every rank of its "
        f"group (or all-reduce each step's sample count, as the stream check does)"
    )


def plan_stream(
    spec: StreamSpec,
    data_parallel_size: int,
    micro_batch: int | Sequence[int] | Sequence[ReplicaGroup],
    accumulation: int,
    epoch: int = 0,
    train_steps: int | None = None,
) -> StreamPlan:
    """The stream's plan for one epoch (`epoch` orders hf_datasets' shards and every shuffle).

    `train_steps` (end_of_epoch "steps"): the run's optimizer steps, echoed; without it the plan
    warns that the run has no end."""
    if accumulation < 1 or epoch < 0 or data_parallel_size < 1:
        raise ValueError("accumulation >= 1, epoch >= 0, data_parallel_size >= 1")
    micro = micro_batch_runs(data_parallel_size, micro_batch)
    check_stream(spec, data_parallel_size, epoch)
    assert spec.splitter is not None
    kind, runs_of_ranks = rank_runs(spec, data_parallel_size, epoch)
    refuse_empty_ranks(spec, data_parallel_size, runs_of_ranks)
    groups = rank_groups(runs_of_ranks, micro)
    runs = micro_batches_run([g.micro_batches for g in groups], spec.end_of_epoch)
    leftover = runs % accumulation
    # steps has no epoch's end to skip the leftover at: it opens the next pass's first step
    counted = runs if spec.end_of_epoch == "steps" else runs - leftover
    groups = tuple(with_short_micro_batches(g, accumulation, counted) for g in groups)
    presented = distinct = 0
    for g in groups:
        shown, kept = trained(g.worker_samples, g.micro_batch_size, counted, spec.end_of_epoch)
        presented += shown * g.count
        distinct += kept * g.count
    N = total_samples(spec)
    warnings = (
        advice.idle_warning(spec, groups),
        advice.examples_warning(kind, data_parallel_size, spec.num_shards),
        advice.unequal_warning(groups, spec, N - distinct, presented - distinct),
        advice.steps_warning(spec, train_steps),
    )
    return StreamPlan(
        splitter=spec.splitter,
        branch=kind,
        readers=data_parallel_size * max(1, spec.num_workers),
        rank_groups=groups,
        samples_read=N * (data_parallel_size if kind == "examples" else 1),
        samples_trained=presented,
        duplicated_samples=presented - distinct,
        dropped_samples=N - distinct,
        optimizer_steps_per_epoch=runs // accumulation,
        suggested_num_shards=advice.suggested_num_shards(spec, data_parallel_size, epoch),
        warnings=tuple(w for w in warnings if w is not None),
        end_of_epoch=spec.end_of_epoch,
        epoch=epoch,
        num_shards=spec.num_shards,
        num_samples=N,
        micro_batches_per_epoch=runs,
        leftover_micro_batches=leftover,
        train_steps=train_steps,
    )


def request_stream(
    request: PlanRequest,
    data_parallel_size: int,
    micro_batch: int | Sequence[int] | Sequence[ReplicaGroup],
    accumulation: int,
) -> StreamPlan | None:
    """The plan's `stream` (None but for a dataset of kind stream): its split over the data-
    parallel ranks, the readers (tensor-, pipeline- and context-parallel peers read the same),
    refused where an epoch would not fill one optimizer step, and under a token budget (whose
    micro-batches hold as many samples as their lengths allow)."""
    spec = request.dataset.stream if request.dataset is not None else None
    if spec is None:
        return None
    if request.packing is not None and request.packing.mode is PackingMode.TOKEN_BUDGET:
        raise InvalidValue(
            "a stream's micro-batches are counted at micro_batch_size samples each; under a token budget "
            "how many samples a micro-batch holds depends on their lengths: the ranks' counts are unknown",
            pointer="/packing/mode",
        )
    steps = request.learning_rate.train_steps if request.learning_rate is not None else None
    stream = plan_stream(spec, data_parallel_size, micro_batch, accumulation, train_steps=steps)
    if stream.optimizer_steps_per_epoch == 0 and spec.end_of_epoch != "steps":
        raise InfeasiblePlan(
            f"an epoch of the stream gives each rank {stream.micro_batches_per_epoch} micro-batches, "
            f"fewer than the {accumulation} of one optimizer step: nothing would train (more samples, "
            'a smaller batch, or end_of_epoch "steps")',
            pointer="/dataset/num_samples",
        )
    if request.loss_normalization is LossNormalization.TOKEN:
        formula = (
            "under loss_normalization token: tokens.loss_scale_formula (the step's valid tokens, all ranks)"
        )
    else:
        batch = accumulation * sum(g.micro_batch_size * g.count for g in stream.rank_groups)
        formula = loss_scale_formula(
            stream.rank_groups, data_parallel_size, batch, request.loss_reduction.value
        )
    return replace(stream, loss_scale_formula=formula)
