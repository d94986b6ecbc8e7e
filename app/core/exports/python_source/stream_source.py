"""The source text of the python skeleton of a stream plan (filled by stream_skeleton).

Over 300 lines: it is one script, the file a user copies, held as one string."""

STREAM_SKELETON = '''#!/usr/bin/env python3
"""DDP training loop for a batchplan plan of a streaming dataset.

__SUMMARY__

Launch one process per GPU with torchrun, e.g.
    torchrun --nproc-per-node __NPROC__ __SCRIPT__
Replace the placeholders build_hf_dataset() (splitter hf_datasets) or shard_names() and
read_shard() (webdataset, rank_worker), collate(), build_model() and loss_fn(). To try the loop
first on CPU with a generated stream of sample ids (gloo backend):
    BATCHPLAN_TOY=1 torchrun --nproc-per-node __WORLD__ __SCRIPT__ --epochs 2

The DataLoader takes no sampler for a stream: the dataset splits itself, by rank and by DataLoader
worker, as SPLITTER says. Ranks then hold unequal micro-batch counts; END_OF_EPOCH says what every
rank runs, agreed once a step by an all-reduce (a rank that ran dry alone would leave the others
waiting in the gradient all-reduce). This loop keeps no checkpoint: a stream's readers hold state
that a restart on another size cannot carry (docs/streams.md).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import random
from itertools import accumulate, count, islice

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

# ---- the plan: change it by planning again, not by hand --------------------------------
DATA_PARALLEL_SIZE = __WORLD__
GLOBAL_BATCH_SIZE = __GLOBAL__
GRADIENT_ACCUMULATION_STEPS = __ACCUM__
# (first rank, stop rank, micro-batch size) for data-parallel ranks [first, stop)
REPLICA_GROUPS = __GROUPS__
SPLITTER = __SPLITTER__  # "hf_datasets", "webdataset" or "rank_worker"
NUM_SHARDS = __NUM_SHARDS__  # the split depends on it: a stream of another count is refused
SHARD_SAMPLES = __SHARD_SAMPLES__  # each shard's samples; None: NUM_SAMPLES shared out evenly
NUM_SAMPLES = __NUM_SAMPLES__
NUM_WORKERS = __NUM_WORKERS__  # DataLoader workers per rank (0: the rank reads itself)
SHUFFLE, SEED = __SHUFFLE__, __SEED__  # the shard order, permuted each epoch, the same on every rank
END_OF_EPOCH = __END_OF_EPOCH__  # "drop", "pad", "cycle" or "steps"
EPOCHS = __EPOCHS__
TRAIN_STEPS = __TRAIN_STEPS__  # END_OF_EPOCH "steps": the run's optimizer steps
STEPS_PER_EPOCH = __STEPS_PER_EPOCH__  # the plan's, for epoch 0's shard order
LR = __LR__  # the peak; planned_lr(step) is every step's


__LR_FUNCTION__


TOY = os.environ.get("BATCHPLAN_TOY") == "1"


def placeholder(function):
    """Marks this skeleton's stand-ins for your data, model and loss: main() names those in use."""
    function.placeholder = True
    return function


def toy_shards() -> list[list[int]]:
    """The generated stream: shard i holds the sample ids offset_i .. offset_i + n_i - 1."""
    q, m = divmod(NUM_SAMPLES, NUM_SHARDS)
    sizes = SHARD_SAMPLES or [q + 1] * m + [q] * (NUM_SHARDS - m)
    return [list(range(a, a + n)) for a, n in zip(accumulate(sizes, initial=0), sizes)]


@placeholder
def build_hf_dataset():
    """A PLACEHOLDER to replace (splitter hf_datasets): your datasets.IterableDataset of
    NUM_SHARDS shards, e.g. load_dataset(..., streaming=True)."""
    import datasets

    if not TOY:
        raise NotImplementedError("build_hf_dataset(): return your stream (or set BATCHPLAN_TOY=1)")
    if SHARD_SAMPLES is None:  # shared out as Dataset.to_iterable_dataset(num_shards) does
        ids = datasets.Dataset.from_dict({"id": list(range(NUM_SAMPLES))})
        return ids.to_iterable_dataset(num_shards=NUM_SHARDS)
    features = datasets.Features({"id": datasets.Value("int64")})
    return datasets.IterableDataset.from_generator(toy_generator, features=features,
                                                   gen_kwargs={"shards": toy_shards()})


def toy_generator(shards):
    for shard in shards:
        for i in shard:
            yield {"id": i}


@placeholder
def shard_names() -> list[str]:
    """A PLACEHOLDER to replace (webdataset, rank_worker): your NUM_SHARDS shard urls or paths."""
    if not TOY:
        raise NotImplementedError("shard_names(): return your shard paths (or set BATCHPLAN_TOY=1)")
    return [f"shard-{i:06d}" for i in range(NUM_SHARDS)]


@placeholder
def read_shard(name: str):
    """A PLACEHOLDER to replace (webdataset, rank_worker): the samples of one shard, in order."""
    if not TOY:
        raise NotImplementedError("read_shard(): yield your shard's samples (or set BATCHPLAN_TOY=1)")
    for i in toy_shards()[int(name.rsplit("-", 1)[1])]:
        yield {"id": i}


@placeholder
def collate(examples: list) -> dict:
    """A PLACEHOLDER to replace: a micro-batch of examples as tensors (the toy's carry their ids)."""
    ids = torch.tensor([int(e["id"]) for e in examples], dtype=torch.float64)
    x = torch.sin(ids[:, None] * torch.arange(1, 9, dtype=torch.float64) * 0.37).float()
    y = x.sum(1, keepdim=True) * 0.5 + torch.cos(ids)[:, None].float() * 0.1
    return {"inputs": x, "targets": y, "ids": [int(e["id"]) for e in examples]}


@placeholder
def build_model() -> nn.Module:
    """A PLACEHOLDER to replace: return your model."""
    if TOY:
        return nn.Linear(8, 1)
    raise NotImplementedError("build_model(): return your model (or set BATCHPLAN_TOY=1)")


@placeholder
def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A PLACEHOLDER to replace: the loss SUMMED over the micro-batch's samples (the loop divides
    by the step's samples over every rank, so a short micro-batch weighs each sample the same)."""
    return nn.functional.mse_loss(output, target, reduction="sum")


class RankWorkerStream(IterableDataset):
    """The shards dealt round-robin to the global reader rank x workers + worker (the shard list
    shuffled by random.Random(SEED + epoch) first when SHUFFLE)."""

    def __init__(self, names: list[str], rank: int, world: int, epoch: int) -> None:
        self.names, self.rank, self.world = names, rank, world
        if SHUFFLE:
            random.Random(SEED + epoch).shuffle(self.names)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for name in self.names[self.rank * workers + worker::self.world * workers]:
            yield from read_shard(name)


def split_stream(rank: int, world: int, epoch: int):
    """This rank's share of the stream in `epoch`, split as SPLITTER splits it."""
    if SPLITTER == "hf_datasets":
        from datasets.distributed import split_dataset_by_node

        ds = build_hf_dataset()
        if ds.n_shards != NUM_SHARDS:
            raise SystemExit(f"build_hf_dataset() has {ds.n_shards} shards, the plan {NUM_SHARDS}: "
                             f"plan again with --num-shards {ds.n_shards}")
        if SHUFFLE:  # shard order only: a larger buffer also mixes samples within a worker
            ds = ds.shuffle(seed=SEED, buffer_size=1, max_buffer_input_shards=1)
        # Shards when NUM_SHARDS % world == 0, else every rank reads all and keeps 1 in world;
        # datasets then splits the rank's shards over its DataLoader workers itself.
        ds = split_dataset_by_node(ds, rank=rank, world_size=world)
        ds.set_epoch(epoch)  # reorders the shards each epoch; without it every epoch repeats
        return ds
    names = shard_names()
    if len(names) != NUM_SHARDS:
        raise SystemExit(f"shard_names() lists {len(names)} shards, the plan {NUM_SHARDS}: plan again")
    if SPLITTER == "webdataset":
        import webdataset as wds

        # split_by_node and split_by_worker read RANK/WORLD_SIZE (torchrun's) and the worker info.
        shards = wds.SimpleShardList(names, seed=SEED + epoch if SHUFFLE else None)
        expand = lambda src: (sample for item in src for sample in read_shard(item["url"]))  # noqa: E731
        return wds.DataPipeline(shards, wds.split_by_node, wds.split_by_worker, expand)
    return RankWorkerStream(names, rank, world, epoch)


def passes(rank: int, world: int, epoch: int, micro_batch_size: int):
    """(micro-batch, first pass) for ever: the rank's own micro-batches, then what END_OF_EPOCH
    gives after them: nothing (drop), full micro-batches cut from its samples again from their
    start, in delivery order (pad), or its stream again (cycle; steps: the stream's next epoch)."""
    def loader(e: int, examples: bool = False):
        return DataLoader(split_stream(rank, world, e), batch_size=micro_batch_size,
                          collate_fn=list if examples else collate, num_workers=NUM_WORKERS,
                          multiprocessing_context="fork" if NUM_WORKERS else None)

    delivered = 0
    for batch in loader(epoch):
        delivered += 1
        yield batch, True
    if not delivered:  # nothing to repeat: the step's all-reduce stops every rank
        return
    if END_OF_EPOCH == "pad":
        again = (e for _ in count() for batch in loader(epoch, examples=True) for e in batch)
        while len(cut := list(islice(again, micro_batch_size))) == micro_batch_size:
            yield collate(cut), False
    elif END_OF_EPOCH != "drop":
        for e in count(epoch + 1):
            empty = True
            for batch in loader(e if END_OF_EPOCH == "steps" else epoch):
                empty = False
                yield batch, False
            if empty:
                return


def replica_batch(rank: int) -> int:
    return next(b for first, stop, b in REPLICA_GROUPS if first <= rank < stop)


def train_epoch(model, optimizer, scheduler, rank, world, epoch, device, state, max_steps):
    """One epoch (a steps run: every step up to max_steps): what this rank trained of it, a
    micro-batch's ids each (the toy's) or its size."""
    accumulation, b = GRADIENT_ACCUMULATION_STEPS, replica_batch(rank)
    stream = passes(rank, world, epoch, b)
    trained: list = []
    while not (max_steps and state["step"] >= max_steps):
        step = list(islice(stream, accumulation))
        full = len(step) == accumulation
        own = full and all(first for _, first in step)
        # [ranks with a whole step, ranks whose step is all their own micro-batches, the step's
        # samples over every rank]: one all-reduce decides the step for every rank alike.
        samples = sum(len(m["targets"]) for m, _ in step)
        agreed = torch.tensor([float(full), float(own), float(samples)], dtype=torch.float64, device=device)
        dist.all_reduce(agreed)
        whole, owned = agreed[0].item() == world, agreed[1].item()
        if not whole or (END_OF_EPOCH == "drop" and owned < world) or (END_OF_EPOCH in ("pad", "cycle")
                                                                      and owned == 0):
            break
        samples = agreed[2].item()
        for i, (batch, _) in enumerate(step):
            inputs, targets = batch["inputs"].to(device), batch["targets"].to(device)
            with contextlib.nullcontext() if i == accumulation - 1 else model.no_sync():
                # DDP averages over the ranks: world / samples makes it the mean over the step.
                (loss_fn(model(inputs), targets) * (world / samples)).backward()
            trained.append(batch.get("ids", len(targets)))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        if rank == 0 and state["step"] % state["log_every"] == 0:
            print(f"epoch {epoch} step {state['step']} lr {scheduler.get_last_lr()[0]:.6g}", flush=True)
    return trained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=TRAIN_STEPS or 0,
                        help="stop after this many optimizer steps (END_OF_EPOCH steps: required)")
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args()
    if END_OF_EPOCH == "steps" and not args.max_steps:
        raise SystemExit('END_OF_EPOCH "steps": the stream repeats for ever; give --max-steps (the plan '
                         f"counts {STEPS_PER_EPOCH} optimizer steps to a pass of the stream)")
    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != DATA_PARALLEL_SIZE:
        raise SystemExit(f"planned for {DATA_PARALLEL_SIZE} processes, launched on {world}: plan again")
__DEVICE__
    torch.manual_seed(SEED)  # DDP also broadcasts rank 0's weights at construction
    net = build_model().to(device)
    model = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = build_optimizer(net.parameters())
    scheduler = __SCHEDULER__
    used = (build_hf_dataset,) if SPLITTER == "hf_datasets" else (shard_names, read_shard)
    stand_ins = [f.__name__ for f in (*used, collate, build_model, loss_fn) if hasattr(f, "placeholder")]
    if rank == 0 and stand_ins:
        print(f"PLACEHOLDERS in use: {', '.join(stand_ins)}: replace them with your data, model and loss",
              flush=True)
    state = {"step": 0, "log_every": args.log_every}
    epochs = range(args.epochs) if END_OF_EPOCH != "steps" else range(1)  # steps: one endless stream
    for epoch in epochs:
        if args.max_steps and state["step"] >= args.max_steps:
            break
        trained = train_epoch(model, optimizer, scheduler, rank, world, epoch, device, state,
                                         args.max_steps)
        ids = trained if trained and isinstance(trained[0], list) else None
        print(f"rank {rank}/{world} epoch {epoch}: trained {len(trained)} micro-batches, "
              f"{sum(map(len, ids)) if ids else '?'} samples" + (f" ids {json.dumps(ids)}" if ids else ""),
              flush=True)
    if rank == 0:
        print(f"done: {state['step']} optimizer steps", flush=True)
__TEARDOWN__


def build_optimizer(params) -> torch.optim.Optimizer:
    return __OPTIMIZER_CALL__


if __name__ == "__main__":
    main()
'''
