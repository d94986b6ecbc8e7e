"""What a stream plan advises: the least shard count that gives every rank a shard, the shard
counts near the asked one that give every reader equal work, and the warnings, each with the
reports it comes from."""

from __future__ import annotations

from dataclasses import replace

from app.core.records.integers import divisors, nearest
from app.core.records.stream import Branch, StreamRankGroup, StreamSpec, StreamWarning
from app.core.request.limits import MAX_STREAM_SHARDS
from app.core.split.stream.counts import rank_runs
from app.core.split.stream.layout import total_samples

IDLE = ("huggingface/datasets#8669", "huggingface/lerobot#3781")
EXAMPLES = ("huggingface/datasets#5961",)
UNEQUAL = (
    "huggingface/datasets#6437",
    "huggingface/datasets#6623",
    "Lightning-AI/litData#233",
    "pytorch/torchtitan#1618",
)


def least_num_shards(spec: StreamSpec, world_size: int) -> int:
    """The fewest shards that give every rank one of its own: one per rank, as rank r takes
    shards r, r + ws, ... (hf_datasets' shards branch, webdataset); rank_worker deals them to
    the readers r x K' + w, so its last rank's first reader needs (ws - 1) x K' + 1."""
    if spec.splitter == "rank_worker":
        return (world_size - 1) * max(1, spec.num_workers) + 1
    return world_size


def equal_work(spec: StreamSpec, world_size: int, epoch: int) -> bool:
    """Every reader reads as many shards and samples as every other, in this plan."""
    _, runs = rank_runs(spec, world_size, epoch)
    return len({pair for _, _, figures in runs for pair in zip(*figures, strict=True)}) == 1


def suggested_num_shards(spec: StreamSpec, world_size: int, epoch: int) -> tuple[int, ...]:
    """Up to four shard counts nearest the asked one (two below, two above) that give every
    reader equal work in every epoch, each checked by planning it; () when the asked count
    already does, or none can.

    Equal work: every reader (rank x worker) the same number of shards and of samples, so
    every rank delivers the same micro-batches at the same micro-batch size and no
    end-of-epoch policy drops or repeats anything. The N samples are taken as shared out
    evenly over the suggested count (`to_iterable_dataset(num_shards)`), whatever the asked
    shard sizes. That needs the R = ws x max(1, num_workers) readers to divide N, and the
    count a multiple of R; where the order is permuted in some epoch (shuffle, or hf_datasets
    at any epoch past 0) the shards must also be equal, the count a divisor of N."""
    N, K = total_samples(spec), spec.num_workers
    R = world_size * max(1, K)
    if N % R:
        return ()
    limit = min(N, MAX_STREAM_SHARDS)
    permuted = spec.shuffle or spec.splitter == "hf_datasets"
    S = spec.num_shards
    if permuted:
        pool = [R * d for d in divisors(N // R) if R * d <= limit]
    else:
        pool = [R * k for k in range(max(1, S // R - 2), S // R + 4) if R * k <= limit]
    even = replace(spec, shard_samples=None, num_samples=N)
    asked_even = spec.shard_samples is None or len(set(spec.shard_samples)) == 1
    if S in pool and asked_even and equal_work(replace(even, num_shards=S), world_size, epoch):
        return ()
    chosen = nearest([c for c in pool if c >= least_num_shards(spec, world_size)], S, 2)
    # The asked count itself stays in when its shards are uneven: shared out evenly, it may do.
    return tuple(c for c in chosen if equal_work(replace(even, num_shards=c), world_size, epoch))


def _ranks(groups: list[StreamRankGroup]) -> str:
    spans = [f"{g.start}" if g.count == 1 else f"{g.start}-{g.stop - 1}" for g in groups]
    return ", ".join(spans[:4]) + (", ..." if len(spans) > 4 else "")


def _cite(sources: tuple[str, ...]) -> str:
    return f" ({', '.join(sources)})"


def idle_warning(spec: StreamSpec, groups: tuple[StreamRankGroup, ...]) -> StreamWarning | None:
    idle = [g for g in groups if g.idle_workers]
    if not idle:
        return None
    most = max(g.idle_workers for g in idle)
    tool = {
        "hf_datasets": "datasets stops them and logs 'Too many dataloader workers' once, from rank 0",
        "webdataset": "wds.WebDataset raises 'No samples found' in such a worker unless empty_check=False",
        "rank_worker": "they yield nothing",
    }[spec.splitter or "rank_worker"]
    message = (
        f"Up to {most} of the {spec.num_workers} DataLoader workers of ranks {_ranks(idle)} get no shard "
        f"and sit idle ({tool}): fewer workers, or more shards, keep every worker reading."
    )
    return StreamWarning("idle_workers", message + _cite(IDLE), IDLE)


def examples_warning(kind: Branch | None, world_size: int, num_shards: int) -> StreamWarning | None:
    if kind != "examples":
        return None
    message = (
        f"num_shards {num_shards} is not a multiple of the {world_size} ranks, so split_dataset_by_node "
        "keeps 1 example in world_size of a stream every rank reads and decodes in full "
        f"({world_size}x the reading), and with DataLoader workers which samples a rank gets depends on "
        "num_workers."
    )
    return StreamWarning("examples_branch", message + _cite(EXAMPLES), EXAMPLES)


def unequal_warning(
    groups: tuple[StreamRankGroup, ...], spec: StreamSpec, dropped: int, duplicated: int
) -> StreamWarning | None:
    counts = [g.micro_batches for g in groups]
    samples = [g.samples for g in groups]
    if len(set(counts)) == 1 and len(set(samples)) == 1:
        return None
    effect = {
        "drop": f"every rank stops at the fewest, {dropped} samples of the epoch untrained",
        "pad": f"short ranks repeat their first samples, {duplicated} samples trained twice or more",
        "cycle": f"finished ranks start their stream again, {duplicated} samples trained twice or more",
        "steps": "the stream repeats and the run is counted in optimizer steps",
    }[spec.end_of_epoch]
    if len(set(counts)) == 1:  # no rank runs dry first, but their micro-batches weigh differently
        message = (
            f"The ranks hold {min(samples)} to {max(samples)} samples an epoch in {counts[0]} micro-batches "
            "each: the loss of each micro-batch must be scaled by the samples the step really holds."
        )
        return StreamWarning("unequal_counts", message + _cite(UNEQUAL), UNEQUAL)
    message = (
        f"The ranks hold {min(samples)} to {max(samples)} samples and {min(counts)} to {max(counts)} "
        "micro-batches an epoch; without a policy the first rank to run dry leaves the others waiting "
        f"in the all-reduce. end_of_epoch {spec.end_of_epoch}: {effect}."
    )
    return StreamWarning("unequal_counts", message + _cite(UNEQUAL), UNEQUAL)


def steps_warning(spec: StreamSpec, train_steps: int | None) -> StreamWarning | None:
    if spec.end_of_epoch != "steps" or train_steps is not None:
        return None
    message = (
        "end_of_epoch steps repeats the stream without end, so the run stops only at a step count "
        "(torchtitan's training.steps); none was given."
    )
    return StreamWarning("steps_without_count", message, ())
