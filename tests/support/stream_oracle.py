"""What the real libraries deliver to each rank and DataLoader worker of a stream: the truth a
stream plan is held to (tests/core/test_stream_split.py).

    deliver(Reading(shard_samples, world_size, num_workers, splitter, micro_batch_sizes,
                    shuffle=False, seed=0, epoch=0), monkeypatch, cache_dir, mode="sim")
        -> [RankDelivery per rank]

Shard i holds the sample ids offset_i .. offset_i + n_i - 1 (offset_i: the samples of the
shards before it), as app.core.split.stream.ids numbers them.

- "hf_datasets": a real `datasets.IterableDataset` (`hf_base`: `to_iterable_dataset` or
  `from_generator`), shuffled by its own `shuffle(seed, buffer_size, max_buffer_input_shards)`
  when asked, split by its own `split_dataset_by_node`, then `set_epoch(epoch)`.
- "webdataset": the real `wds.DataPipeline(SimpleShardList(names, seed), split_by_node,
  split_by_worker, expand)`; rank and world size reach `split_by_node` through RANK and
  WORLD_SIZE, which it reads (webdataset.utils.pytorch_worker_info). The plan's shuffle
  convention, seed + epoch, is passed as SimpleShardList's seed (it has no epoch of its own).
- "rank_worker": a torch IterableDataset dealing the shards to reader rank x K' + worker.

mode "real" iterates a real `DataLoader(ds, batch_size=b, num_workers=K)` with forked worker
processes. mode "sim" runs the same dataset objects in this process, worker by worker: it sets
torch's worker-info global as torch's `_worker_loop` does, cuts batches with torch's own
`_IterableDatasetFetcher`, and merges the workers' batches in the DataLoader's order (round k:
batch k of each worker that still has one). Ported from the research oracle that held both
modes to each other.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


@dataclass
class RankDelivery:
    micro_batches: list[list[int]]  # in delivery order
    micro_batch_workers: list[int]  # the worker that made each
    worker_samples: list[list[int]]  # what each worker yielded, in order (one with num_workers 0)
    worker_shards: list[list[int]]  # the shards it yielded from, in order


def shard_id_lists(shard_samples: list[int]) -> list[list[int]]:
    out, offset = [], 0
    for n in shard_samples:
        out.append(list(range(offset, offset + n)))
        offset += n
    return out


def _tag(examples: list[dict[str, Any]]) -> tuple[int, list[int]]:
    """collate_fn: (the worker's id, 0 in the main process; the batch's sample ids)."""
    info = get_worker_info()
    return (info.id if info is not None else 0, [int(e["id"]) for e in examples])


def round_robin(per_worker: list[list[Any]]) -> list[tuple[int, Any]]:
    out, k = [], 0
    while any(k < len(b) for b in per_worker):
        out += [(w, b[k]) for w, b in enumerate(per_worker) if k < len(b)]
        k += 1
    return out


def _hf_ids(shards: list[list[int]]):
    """The generator of `IterableDataset.from_generator`: its `shards` list is the dataset's
    shard list (what shuffle permutes and split_dataset_by_node and the workers slice)."""
    for shard in shards:
        for i in shard:
            yield {"id": i}


def hf_base(shard_samples: list[int]):
    """The dataset every rank starts from: `Dataset.to_iterable_dataset(num_shards)` where the
    sizes are the contiguous near-equal split it makes, else `IterableDataset.from_generator`
    with one list of ids per shard in `gen_kwargs` (datasets' documented way to a stream of
    given shards; to_iterable_dataset cannot cut uneven ones)."""
    from datasets import Dataset, Features, IterableDataset, Value

    N, S = sum(shard_samples), len(shard_samples)
    q, m = divmod(N, S)
    if list(shard_samples) == [q + 1] * m + [q] * (S - m):
        return Dataset.from_dict({"id": list(range(N))}).to_iterable_dataset(num_shards=S)
    features = Features({"id": Value("int64")})
    return IterableDataset.from_generator(
        _hf_ids, features=features, gen_kwargs={"shards": shard_id_lists(shard_samples)}
    )


def _hf_dataset(base, rank, world_size, shuffle, seed, epoch, buffer_size, input_shards):
    from datasets.distributed import split_dataset_by_node

    ds = base
    if shuffle:
        ds = ds.shuffle(seed=seed, buffer_size=buffer_size, max_buffer_input_shards=input_shards)
    ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
    ds.set_epoch(epoch)
    return ds


class _Expand:
    """webdataset stage: {"url": name} -> samples (in place of opening a tar file)."""

    def __init__(self, by_name: dict[str, list[int]]) -> None:
        self.by_name = by_name

    def __call__(self, src):
        for item in src:
            url = item["url"] if isinstance(item, dict) else item
            for i in self.by_name[url]:
                yield {"id": i}


def _wds_dataset(shard_samples, shuffle, seed, epoch):
    import webdataset as wds

    names = [f"shard-{i:06d}" for i in range(len(shard_samples))]
    by_name = dict(zip(names, shard_id_lists(shard_samples), strict=True))
    shardlist = wds.SimpleShardList(names, seed=(seed + epoch) if shuffle else None)
    return wds.DataPipeline(shardlist, wds.split_by_node, wds.split_by_worker, _Expand(by_name))


class RankWorkerShards(IterableDataset):
    """The shard list (permuted by random.Random(seed + epoch) when shuffled) dealt round-robin
    to the global reader rank x K' + worker, K' = max(1, num_workers)."""

    def __init__(self, shard_samples, rank, world_size, shuffle, seed, epoch):
        self.shards = shard_id_lists(shard_samples)
        self.rank, self.world_size = rank, world_size
        self.order = list(range(len(self.shards)))
        if shuffle:
            random.Random(seed + epoch).shuffle(self.order)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        reader = self.rank * workers + worker
        for shard in islice(self.order, reader, None, self.world_size * workers):
            for i in self.shards[shard]:
                yield {"id": i}


def _sim_worker(ds, worker: int, num_workers: int, b: int) -> list[tuple[int, list[int]]]:
    from torch.utils.data._utils import fetch
    from torch.utils.data._utils import worker as worker_module

    old = worker_module._worker_info
    try:
        if num_workers > 0:
            ds = copy.deepcopy(ds)  # each worker process holds its own copy
            worker_module._worker_info = worker_module.WorkerInfo(
                id=worker, num_workers=num_workers, seed=0, dataset=ds
            )
        fetcher = fetch._IterableDatasetFetcher(ds, True, _tag, False)
        out = []
        while True:
            try:
                out.append(fetcher.fetch([None] * b))
            except StopIteration:
                return out
    finally:
        worker_module._worker_info = old


def _run(ds, num_workers: int, b: int, mode: str) -> list[tuple[int, list[int]]]:
    if mode == "real":
        return list(DataLoader(ds, batch_size=b, num_workers=num_workers, collate_fn=_tag))
    per = [_sim_worker(ds, w, num_workers, b) for w in range(max(1, num_workers))]
    return [batch for _, batch in round_robin(per)]


@dataclass
class Reading:
    """A stream as the libraries are asked to read it. hf_datasets' shuffle buffer is 1 and
    one input shard here (the pure shard permutation whose ids the plan lists); the library's
    own defaults (1000, 10) change the order within a worker, not the counts."""

    shard_samples: list[int]
    world_size: int
    num_workers: int
    splitter: str
    micro_batch_sizes: list[int]
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    buffer_size: int = 1
    max_buffer_input_shards: int = 1


def _rank_dataset(reading: Reading, rank: int, base: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    r = reading
    if r.splitter == "hf_datasets":
        return _hf_dataset(
            base, rank, r.world_size, r.shuffle, r.seed, r.epoch, r.buffer_size, r.max_buffer_input_shards
        )
    if r.splitter == "webdataset":
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(r.world_size))
        return _wds_dataset(r.shard_samples, r.shuffle, r.seed, r.epoch)
    return RankWorkerShards(r.shard_samples, rank, r.world_size, r.shuffle, r.seed, r.epoch)


def deliver(
    reading: Reading, monkeypatch: pytest.MonkeyPatch, cache_dir: Path, mode: str = "sim"
) -> list[RankDelivery]:
    """Per rank, what the libraries deliver."""
    assert mode in ("sim", "real")
    shard_of = {i: s for s, ids in enumerate(shard_id_lists(reading.shard_samples)) for i in ids}
    monkeypatch.delenv("WORKER", raising=False)  # they would override the DataLoader's worker id
    monkeypatch.delenv("NUM_WORKERS", raising=False)
    base = None
    if reading.splitter == "hf_datasets":
        import datasets

        # from_generator keeps lock files in datasets' cache: the test's own folder, not ~/.cache
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache_dir))
        base = hf_base(reading.shard_samples)
    ranks = []
    K = reading.num_workers
    for rank in range(reading.world_size):
        ds = _rank_dataset(reading, rank, base, monkeypatch)
        tagged = _run(ds, K, reading.micro_batch_sizes[rank], mode)
        samples = [[i for w, ids in tagged if w == worker for i in ids] for worker in range(max(1, K))]
        shards = [list(dict.fromkeys(shard_of[i] for i in ids)) for ids in samples]
        ranks.append(RankDelivery([ids for _, ids in tagged], [w for w, _ in tagged], samples, shards))
    return ranks


def quiet() -> None:
    """datasets' log lines (its "Too many dataloader workers" among them), off for the run."""
    import datasets

    datasets.logging.set_verbosity_error()
