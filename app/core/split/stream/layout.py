"""Which shards and how many samples each reader (rank, DataLoader worker) of a stream gets.

The rules, read in `datasets` 5.2.0, WebDataset 1.0.2 and torch 2.13 (and held to those
libraries by tests/core/test_stream_split.py). S shards, `order` the shard list as every rank
sees it, ws ranks, K workers per rank, K' = max(1, K), R = ws x K' readers:

- hf_datasets, the shards branch (`split_dataset_by_node` when S % ws == 0): rank r takes
  `order[r::ws]`, its worker w that list's `[w::K]`: the positions p with p % R = r + ws x w.
- hf_datasets, the examples branch (S % ws != 0): worker w of every rank reads the whole
  dataset's `order[w::K]` (all of `order` with K = 0) and rank r keeps the positions r, r + ws,
  ... of that worker's stream: ceil((L_w - r) / ws) samples of the L_w the worker reads.
- webdataset (`split_by_node`, then `split_by_worker`): as the shards branch, for any S.
- rank_worker: the global reader g = r x K' + w takes `order[g::R]`.

`order`: hf_datasets shuffles with numpy (`shuffle(seed)` permutes the shard list with
`default_rng(seed)`; `set_epoch(e)` with e != 0 permutes that list again with
`default_rng(e)`, shuffled or not); webdataset and rank_worker take the plan's convention,
`random.Random(seed + epoch).shuffle` of the shard list before the split when shuffled. That
is the rank_worker reader's own rule; WebDataset itself shuffles the list with
`SimpleShardList(urls, seed=seed)` (the same `random.Random(seed)` but no epoch: the same
order every epoch unless the seed passed is seed + epoch), and its `detshuffle` stage runs
after the split and reorders only within a worker.
"""

from __future__ import annotations

import random

from app.core.records.stream import Branch, Splitter, StreamSpec
from app.core.request.limits import MAX_LISTED_SHARDS
from app.core.split.stream.numpy_shuffle import numpy_permutation

# What a plan costs is bounded by these (app.core.split.stream.counts): shards shared out by
# num_samples are counted in closed form, whatever their number; a shard_samples list, or
# uneven shards in a permuted order (a pure-Python shuffle, ~1 us a shard), shard by shard.
# The request's table of limits holds the same bounds, so they are read from it.
MAX_COUNTED_SHARDS = MAX_LISTED_SHARDS
MAX_STREAM_READERS = 1_000_000  # ranks x workers


def shard_sizes(spec: StreamSpec) -> tuple[int, ...]:
    """Each shard's samples; `num_samples` shared out as `to_iterable_dataset` does."""
    if spec.shard_samples is not None:
        return spec.shard_samples
    q, m = divmod(spec.num_samples or 0, spec.num_shards)
    return (q + 1,) * m + (q,) * (spec.num_shards - m)


def total_samples(spec: StreamSpec) -> int:
    return sum(spec.shard_samples) if spec.shard_samples is not None else spec.num_samples or 0


def equal_shards(spec: StreamSpec) -> bool:
    if spec.shard_samples is not None:
        return len(set(spec.shard_samples)) <= 1
    return (spec.num_samples or 0) % spec.num_shards == 0


def branch(splitter: Splitter, num_shards: int, world_size: int) -> Branch | None:
    if splitter != "hf_datasets":
        return None
    return "shards" if num_shards % world_size == 0 else "examples"


def shard_order(spec: StreamSpec, epoch: int) -> tuple[int, ...] | None:
    """The shard list in the order the splitter slices it; None for 0, 1, ..., S - 1."""
    S = spec.num_shards
    if spec.splitter == "hf_datasets":
        order = numpy_permutation(spec.seed, S) if spec.shuffle else None
        if epoch != 0:
            again = numpy_permutation(epoch, S)
            order = again if order is None else tuple(order[j] for j in again)
        return order
    if not spec.shuffle:
        return None
    shuffled = list(range(S))
    random.Random(spec.seed + epoch).shuffle(shuffled)
    return tuple(shuffled)


def needs_order(spec: StreamSpec, epoch: int) -> bool:
    """Whether the counts depend on a permuted order (and so cost one): equal shards give
    the same counts in any order."""
    permuted = spec.shuffle or (spec.splitter == "hf_datasets" and epoch != 0)
    return permuted and not equal_shards(spec)


def reader_shards(spec: StreamSpec, world_size: int, epoch: int, rank: int) -> list[list[int]]:
    """The shards each worker of `rank` reads, in reading order (the examples branch: all the
    shards the worker reads, of which the rank keeps every ws-th sample)."""
    S, K = spec.num_shards, spec.num_workers
    Kp = max(1, K)
    order = shard_order(spec, epoch)
    shards = list(range(S)) if order is None else list(order)
    assert spec.splitter is not None
    if branch(spec.splitter, S, world_size) == "examples":
        return [shards[w::Kp] for w in range(Kp)]
    if spec.splitter == "rank_worker":
        return [shards[rank * Kp + w :: world_size * Kp] for w in range(Kp)]
    return [shards[rank::world_size][w::Kp] for w in range(Kp)]
