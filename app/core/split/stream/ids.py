"""The sample ids of a stream plan: each rank's micro-batches, in the order its DataLoader
delivers them, before and after the end-of-epoch policy. What the check holds its ranks to.

Shard i holds the ids offset_i .. offset_i + n_i - 1, offset_i the samples of the shards
before it, so an id says which shard and row it came from. The order within a worker is the
shard order's, shard by shard: `datasets` keeps it so with `shuffle(seed, buffer_size=1,
max_buffer_input_shards=1)` (a larger buffer reorders within a worker and, in the examples
branch, changes which samples a rank keeps but not how many; more input shards interleave a
worker's shards).
"""

from __future__ import annotations

from itertools import accumulate, chain

from app.core.errors.domain import InvalidValue
from app.core.records.stream import StreamSpec
from app.core.split.stream.layout import branch, reader_shards, shard_sizes, total_samples

MAX_LISTED_SAMPLES = 1 << 24  # ids are listed for checks and tests, not for the plan's counts

MicroBatches = tuple[tuple[int, ...], ...]


def worker_samples(spec: StreamSpec, world_size: int, epoch: int, rank: int) -> list[list[int]]:
    """The ids each worker of `rank` yields, in order (one list with num_workers 0)."""
    if total_samples(spec) > MAX_LISTED_SAMPLES:
        raise InvalidValue(
            f"sample ids are listed for streams of up to {MAX_LISTED_SAMPLES} samples",
            pointer="/dataset/num_samples",
        )
    sizes = shard_sizes(spec)
    offsets = [0, *accumulate(sizes)]
    per_worker = reader_shards(spec, world_size, epoch, rank)
    streams = [list(chain.from_iterable(range(offsets[s], offsets[s + 1]) for s in ws)) for ws in per_worker]
    assert spec.splitter is not None
    if branch(spec.splitter, spec.num_shards, world_size) == "examples":
        return [stream[rank::world_size] for stream in streams]
    return streams


def delivered(streams: list[list[int]], b: int) -> MicroBatches:
    """The DataLoader's delivery: round k takes batch k of each worker that still has one."""
    batches = [[tuple(s[i : i + b]) for i in range(0, len(s), b)] for s in streams]
    rounds = max((len(x) for x in batches), default=0)
    return tuple(x[k] for k in range(rounds) for x in batches if k < len(x))


def delivered_micro_batches(
    spec: StreamSpec, world_size: int, micro_batch_sizes: tuple[int, ...], epoch: int = 0
) -> tuple[MicroBatches, ...]:
    """Per rank, its micro-batches of one pass of its stream, before the end-of-epoch policy."""
    return tuple(
        delivered(worker_samples(spec, world_size, epoch, r), micro_batch_sizes[r]) for r in range(world_size)
    )


def extended(own: MicroBatches, b: int, runs: int, pad: bool) -> MicroBatches:
    """The first `runs` micro-batches a rank runs: its own, then (pad) full micro-batches of its
    first samples in delivery order, or (cycle, steps) its own again from the start."""
    if runs <= len(own):
        return own[:runs]
    if not pad:
        passes, rest = divmod(runs, len(own))
        return own * passes + own[:rest]
    flat = [i for batch in own for i in batch]
    extra = [tuple(flat[(j * b + i) % len(flat)] for i in range(b)) for j in range(runs - len(own))]
    return own + tuple(extra)


def trained_micro_batches(
    spec: StreamSpec,
    world_size: int,
    micro_batch_sizes: tuple[int, ...],
    accumulation: int,
    epoch: int = 0,
) -> tuple[MicroBatches, ...]:
    """Per rank, the micro-batches it trains in the epoch: the policy applied, then the micro-
    batches past the last whole optimizer step left out (drop, pad, cycle) or kept (steps: they
    open the next pass's first step)."""
    own = delivered_micro_batches(spec, world_size, micro_batch_sizes, epoch)
    counts = [len(x) for x in own]
    runs = min(counts) if spec.end_of_epoch == "drop" else max(counts)
    if spec.end_of_epoch != "steps":
        runs -= runs % accumulation
    return tuple(
        extended(x, micro_batch_sizes[r], runs, spec.end_of_epoch == "pad") for r, x in enumerate(own)
    )
