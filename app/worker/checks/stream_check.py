"""The stream check: every rank reads a stream plan's epoch through real DataLoader worker
processes over the splitter's real IterableDataset (`datasets`' split_dataset_by_node,
WebDataset's split_by_node and split_by_worker, or a reader dealt shards by rank x workers +
worker), records the samples it trains, and trains each optimizer step under DDP; rank 0 holds
the samples to the plan's prediction (app.core.split.stream.ids) and every step's gradient to
the single-process mean over the same samples. The controls read the stream as a mistaken loop
would, or (no_end_of_epoch_policy) run its collectives until they hang (training/hang.py).

Over 300 lines: the three splitters' readers and their mistakes are one table of cases.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate, chain, count, islice
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import IterableDataset as TorchIterable

from app.contract.check_result import CheckResult, ControlOutcome, SkippedControl
from app.contract.kinds.stream import SampleCounts, StreamCheck, StreamOutcome, StreamRanks
from app.contract.spec import CheckSpec
from app.core.records.stream import StreamSpec
from app.core.split.stream.ids import trained_micro_batches
from app.core.split.stream.layout import shard_sizes
from app.worker.checks import equivalence
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.result_parts import DETECTION_FACTOR, TOLERANCE, Measured, judged_result
from app.worker.training.gradients import Batch, compare, ddp_gradient, mean_gradient, weighted_gradients
from app.worker.training.hang import HANG_TIMEOUT_S, hangs
from app.worker.training.sync_batch_norm import forward_is_collective

Ids = tuple[int, ...]
# Steps whose gradients one all-reduce carries (a steps x parameters tensor).
STEPS_PER_ALL_REDUCE = 32

# The controls in the order they run, each with what it does wrong.
CONTROLS: dict[str, str] = {
    "no_rank_split": "every rank reads the whole stream (no split by node: datasets#3423, Lightning#15734)",
    "no_worker_split": "every DataLoader worker of a rank reads the rank's whole share (no split by worker)",
    "same_reader_index": "rank and worker ids used as one index (rank + worker): gaps and duplicates",
    "unseeded_shuffle": "each rank shuffles the shard list with its own seed: shards read twice or never",
    "no_end_of_epoch_policy": "unequal micro-batch counts and no end-of-epoch policy: the first rank to run "
    "dry leaves the others in the all-reduce (datasets#6437, torchtitan#1618)",
}
SAME_SAMPLES = "on this plan the mistake trains the same samples in every step"
# `datasets` splits a node's shards over its DataLoader workers itself (_iter_pytorch), from
# the DataLoader's worker info: a loop cannot leave that split out or index it wrongly.
_HF_OWN_WORKER_SPLIT = "datasets splits a node's shards over its DataLoader workers itself (_iter_pytorch)"


@dataclass
class _Epoch:
    """What this rank read and trained; on rank 0 also every rank's, the steps' gradients, and
    the controls' epochs (every rank's trained micro-batches)."""

    model: DistributedDataParallel
    trained: list[list[Ids]] = field(default_factory=list)  # every rank's, policy applied
    delivered: list[int] = field(default_factory=list)  # every rank's micro-batches before it
    grads: list[torch.Tensor] = field(default_factory=list)
    references: list[torch.Tensor] = field(default_factory=list)
    single: torch.nn.Module | None = None  # rank 0's one-process model (SyncBatchNorm as BatchNorm)
    mistaken: dict[str, list[list[Ids]]] = field(default_factory=dict)
    hung: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # a hang that did not come
    skipped: list[SkippedControl] = field(default_factory=list)


class StreamStep:
    """A stream plan's epoch on one process per data-parallel rank, read as the plan says."""

    name: ClassVar[str] = "stream"
    stage: ClassVar[Stage] = "step"
    laps: ClassVar[Laps] = Laps(plan="epoch")

    def applies(self, spec: CheckSpec) -> bool:
        return spec.stream is not None  # the plan's dataset is a stream

    def prepare(self, ctx: Context) -> _Epoch:
        if ctx.group.world != ctx.spec.data_parallel_size:
            raise ValueError(
                f"a stream check runs one process per data-parallel rank: {ctx.spec.data_parallel_size} "
                f"ranks on {ctx.group.world} processes; check a plan of at most this worker's ranks"
            )
        module = ctx.workload.module(ctx.dtype, ctx.device)
        return _Epoch(DistributedDataParallel(module))

    def plan(self, ctx: Context, state: _Epoch) -> None:
        stream = _stream(ctx.spec)
        state.trained, state.delivered = _epoch(stream, ctx.group.rank, ctx.group.world, None)
        ctx.timer.lap("read")
        g, rank = stream.accumulation, ctx.group.rank
        feed = ctx.feed(ctx.workload)
        steps: list[list[Batch]] = []
        for k in range(len(state.trained[rank]) // g):
            total = sum(len(m) for ranks in state.trained for m in ranks[k * g : (k + 1) * g])
            steps.append([_scaled(m, total, ctx.spec) for m in state.trained[rank][k * g : (k + 1) * g]])
        # The first step as the job runs it, under DDP; the rest from one backward per
        # micro-batch and one all-reduce per chunk of steps: a step's gradient is linear in its
        # micro-batches' loss scales, so this is the sum DDP's hooks make, without a collective
        # a step (weighted_gradients; not for a forward that makes collectives of its own).
        grads = [ddp_gradient(state.model, steps[0], feed)] if steps else []
        rest = steps[1:]
        if forward_is_collective(state.model.module):
            grads += [ddp_gradient(state.model, step, feed) for step in rest]
        else:
            for chunk in range(0, len(rest), STEPS_PER_ALL_REDUCE):
                grads += weighted_gradients(
                    state.model.module, rest[chunk : chunk + STEPS_PER_ALL_REDUCE], feed
                )
        state.grads = grads if ctx.leader else []

    def controls(self, ctx: Context, state: _Epoch) -> None:
        stream, rank, world = _stream(ctx.spec), ctx.group.rank, ctx.group.world
        data = stream.dataset
        readings: list[str] = []
        for name in CONTROLS:
            reason = _not_applicable(name, data, world)
            if reason is not None:
                state.skipped.append(SkippedControl(name, reason))
            elif name == "no_end_of_epoch_policy":
                steps = [n // stream.accumulation for n in state.delivered]
                if len(set(steps)) == 1:
                    reason = (
                        f"every rank's stream fills {steps[0]} optimizer steps: without a policy none waits"
                    )
                    state.skipped.append(SkippedControl(name, reason))
                elif hangs(_unsynced_steps(steps[rank]), HANG_TIMEOUT_S):
                    state.hung.append(name)
                else:
                    state.missed.append(name)
            else:
                readings.append(name)
        if readings:
            state.mistaken = dict(zip(readings, _epochs(stream, rank, world, readings), strict=True))

    def measure(self, ctx: Context, state: _Epoch) -> bool:
        return False

    def reference(self, ctx: Context, state: _Epoch) -> None:
        g = _stream(ctx.spec).accumulation
        state.single = ctx.workload.single_process_module(ctx.dtype, ctx.device)
        state.references = [_step_gradient(ctx, state, state.trained, k, g) for k in range(len(state.grads))]

    def result(self, ctx: Context, state: _Epoch, prior: CheckResult | None) -> CheckResult:
        spec, stream = ctx.spec, _stream(ctx.spec)
        tolerance = TOLERANCE[spec.dtype]
        errors = [compare(grad, ref)[1] for grad, ref in zip(state.grads, state.references, strict=True)]
        worst = max(range(len(errors)), key=errors.__getitem__)
        findings = equivalence.static_findings(
            state.model.module, spec, processes=ctx.group.world, own_loss=ctx.workload.own_loss
        )
        measured = Measured(
            state.grads[worst], state.references[worst], [], [], findings, False, spec.micro_batch_sizes()
        )
        judged = judged_result(spec, ctx.group, ctx.workload.name, measured, replicas_per_rank=1)
        outcomes = [ControlOutcome.hung_outcome(n, CONTROLS[n]) for n in state.hung]
        outcomes += [ControlOutcome(n, CONTROLS[n], 0.0, 0.0, detected=False) for n in state.missed]
        skipped = list(state.skipped)
        for name, trained in state.mistaken.items():
            outcome = _judged_control(ctx, state, name, trained, DETECTION_FACTOR * tolerance)
            if outcome is None:
                skipped.append(SkippedControl(name, SAME_SAMPLES))
            else:
                outcomes.append(outcome)
        order = list(CONTROLS)
        return dataclasses.replace(
            judged,
            controls=tuple(sorted(outcomes, key=lambda c: order.index(c.name))),
            controls_skipped=tuple(sorted(skipped, key=lambda c: order.index(c.name))),
            stream=_outcome(stream, state.trained, len(state.grads), worst, ctx.group.world),
        )


def _stream(spec: CheckSpec) -> StreamCheck:
    assert spec.stream is not None
    return spec.stream


def _scaled(micro: Ids, total: int, spec: CheckSpec) -> Batch:
    """A micro-batch with its exact loss scale: the step's loss is the mean over all the
    `total` samples every rank trains in it, short last micro-batches included (DDP then
    averages over the ranks, hence the data-parallel size)."""
    dp = spec.data_parallel_size
    if spec.loss_reduction == "mean":
        return (list(micro), dp * len(micro) / total, "mean")
    return (list(micro), dp / total, "sum")


def _step_gradient(ctx: Context, state: _Epoch, trained: list[list[Ids]], k: int, g: int) -> torch.Tensor:
    """Rank 0 alone: the mean loss over every sample the ranks train in step k, on one process
    (the initial weights: no step changes them)."""
    step = [i for ranks in trained for m in ranks[k * g : (k + 1) * g] for i in m]
    return _mean_gradient(ctx, state, step)


def _mean_gradient(ctx: Context, state: _Epoch, samples: list[int]) -> torch.Tensor:
    assert state.single is not None
    return mean_gradient(state.single, ctx.workload, [samples], ctx.dtype, ctx.device)


# ---- reading the stream: the splitter's real dataset, the DataLoader's real workers


def _epoch(
    stream: StreamCheck, rank: int, world: int, mistake: str | None
) -> tuple[list[list[Ids]], list[int]]:
    """Every rank's micro-batches of the epoch as its DataLoader delivered them (this rank's
    read here, the others' gathered), with the plan's end-of-epoch policy applied; and how many
    each delivered before the policy."""
    data = stream.dataset
    own = _read(
        _dataset(data, rank, world, mistake), stream.micro_batch_sizes[rank], data.num_workers, rank, world
    )
    return _trained(stream, _gathered(own, world))


def _epochs(stream: StreamCheck, rank: int, world: int, mistakes: list[str]) -> list[list[list[Ids]]]:
    """`_epoch` of each mistaken reading, read in one DataLoader pass (`_Readings`)."""
    data = stream.dataset
    readings = _Readings([_dataset(data, rank, world, m) for m in mistakes], stream.micro_batch_sizes[rank])
    own = _read(readings, None, data.num_workers, rank, world)
    mine = readings.delivered(own)
    everyone = _gathered(mine, world)
    return [_trained(stream, [x[i] for x in everyone])[0] for i in range(len(mistakes))]


def _gathered(own: Any, world: int) -> list[Any]:
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, own)
    return everyone


def _trained(stream: StreamCheck, everyone: list[list[Ids]]) -> tuple[list[list[Ids]], list[int]]:
    counts = [len(x) for x in everyone]
    data = stream.dataset
    trained = [
        _policy(x, counts, data.end_of_epoch, stream.micro_batch_sizes[r], stream.accumulation)
        for r, x in enumerate(everyone)
    ]
    return trained, counts


class _Readings(TorchIterable[tuple[int, int, int, Ids]]):
    """Several readings of the stream in one DataLoader pass, so a check starts its workers once
    for all its controls: each worker iterates every reading's dataset in turn (the splitters
    see the worker's real worker info) and cuts its micro-batches as the DataLoader's fetcher
    does an IterableDataset's (b samples at a time, the last short), each tagged with its
    reading, its number within the worker's reading, and the worker. `delivered` puts each
    reading's back in the DataLoader's delivery order: round k, batch k of every worker that has
    one, in worker order."""

    def __init__(self, datasets: list[Any], b: int) -> None:
        self.datasets, self.b = datasets, b

    def __iter__(self) -> Iterator[tuple[int, int, int, Ids]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        for reading, dataset in enumerate(self.datasets):
            samples = iter(dataset)
            for k in count():
                batch = _ids(list(islice(samples, self.b)))
                if not batch:
                    break
                yield reading, k, worker, batch

    def delivered(self, items: list[Any]) -> list[list[Ids]]:
        ordered = sorted(items, key=lambda item: (item[0], item[1], item[2]))
        return [[item[3] for item in ordered if item[0] == r] for r in range(len(self.datasets))]


def _policy(own: list[Ids], counts: list[int], policy: str, b: int, g: int) -> list[Ids]:
    """What the training loop runs of a rank's delivered micro-batches: drop stops every rank at
    the fewest any has; pad goes on with full micro-batches of the rank's first samples; cycle and
    steps start the rank's stream again; all but steps end at the last whole optimizer step."""
    runs = min(counts) if policy == "drop" else max(counts)
    if policy != "steps":
        runs -= runs % g
    if runs <= len(own) or not own:
        return own[:runs]
    if policy == "pad":
        flat = [i for m in own for i in m]
        return own + [tuple(flat[(j * b + i) % len(flat)] for i in range(b)) for j in range(runs - len(own))]
    return [own[j % len(own)] for j in range(runs)]


@contextmanager
def _loader_env(rank: int, world: int) -> Iterator[None]:
    """What the DataLoader's workers need of the rank: RANK and WORLD_SIZE as torchrun sets them
    (WebDataset reads them), and the right to start processes: a warm rank is a daemonic
    process, which multiprocessing forbids children; the workers end with the reading."""
    config: dict[str, Any] = getattr(multiprocessing.current_process(), "_config")  # noqa: B009
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS")}
    daemon = config.get("daemon", False)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    for key in ("WORKER", "NUM_WORKERS"):  # they would override the DataLoader's worker info
        os.environ.pop(key, None)
    config["daemon"] = False
    try:
        yield
    finally:
        config["daemon"] = daemon
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _read(dataset: Any, b: int | None, workers: int, rank: int, world: int) -> list[Any]:
    """The DataLoader's delivery: micro-batches of b ids, or (b None) the items as `_Readings`
    cut them."""
    # fork: a worker starts from the rank's memory in milliseconds, the dataset already built
    context = "fork" if workers else None
    collate = _ids if b is not None else _as_is
    loader = DataLoader(
        dataset, batch_size=b, num_workers=workers, collate_fn=collate, multiprocessing_context=context
    )
    with _loader_env(rank, world):
        return list(loader)


def _as_is(item: Any) -> Any:
    return item


def _ids(examples: list[Any]) -> Ids:
    return tuple(int(e["id"]) if isinstance(e, dict) else int(e) for e in examples)


def _shards(data: StreamSpec) -> list[list[int]]:
    return _shard_ids(shard_sizes(data))


def _shard_ids(sizes: Sequence[int]) -> list[list[int]]:
    """Shard i holds the ids offset_i .. offset_i + n_i - 1, as the plan's ids module numbers them."""
    return [list(range(a, a + n)) for a, n in zip(accumulate(sizes, initial=0), sizes, strict=False)]


def _own_seed(data: StreamSpec, rank: int) -> int:
    return data.seed + 1 + rank  # unseeded_shuffle: whatever seed each rank's process drew


def _dataset(data: StreamSpec, rank: int, world: int, mistake: str | None) -> Any:
    builders: dict[str, Callable[[StreamSpec, int, int, str | None], Any]] = {
        "hf_datasets": _hf_datasets,
        "webdataset": _webdataset,
        "rank_worker": _RankWorker,
    }
    assert data.splitter is not None
    return builders[data.splitter](data, rank, world, mistake)


def _missing(package: str) -> ValueError:
    return ValueError(
        f"this worker cannot check a stream split with {package!r}: it is not installed here "
        f"(pip install {package}, the version the project's dev dependencies pin)"
    )


def _hf_datasets(data: StreamSpec, rank: int, world: int, mistake: str | None) -> Any:
    """`datasets`' own IterableDataset, in memory: num_samples shared out by to_iterable_dataset,
    a shard_samples list as generator shards; its shuffle (a shard permutation: buffer 1) and
    split_dataset_by_node."""
    try:
        from datasets.distributed import split_dataset_by_node
    except ImportError:
        raise _missing("datasets") from None

    ds = _hf_stream(tuple(shard_sizes(data)), data.shard_samples is None)
    if data.shuffle or mistake == "unseeded_shuffle":
        seed = _own_seed(data, rank) if mistake == "unseeded_shuffle" else data.seed
        ds = ds.shuffle(seed=seed, buffer_size=1, max_buffer_input_shards=1)
    return ds if mistake == "no_rank_split" else split_dataset_by_node(ds, rank=rank, world_size=world)


@functools.lru_cache(maxsize=2)
def _hf_stream(sizes: tuple[int, ...], shared_out: bool) -> Any:
    """The stream before its shuffle and split, built once for a check's readings (the plan's
    and its controls': datasets' shuffle and split return new datasets, never change this one)
    and the next check of the same stream."""
    import datasets

    shards = _shard_ids(sizes)
    if shared_out:
        ids = datasets.Dataset.from_dict({"id": list(chain.from_iterable(shards))})
        return ids.to_iterable_dataset(num_shards=len(sizes))
    features = datasets.Features({"id": datasets.Value("int64")})
    generated = datasets.IterableDataset.from_generator
    return generated(_generate, features=features, gen_kwargs={"shards": shards})


def _generate(shards: list[list[int]]) -> Iterator[dict[str, int]]:
    for shard in shards:
        for i in shard:
            yield {"id": i}


def _webdataset(data: StreamSpec, rank: int, world: int, mistake: str | None) -> Any:
    """WebDataset's pipeline over shard names: SimpleShardList (seeded when shuffled),
    split_by_node, split_by_worker, then each shard expanded to its samples."""
    try:
        import webdataset as wds
    except ImportError:
        raise _missing("webdataset") from None
    names = [f"shard-{i:06d}" for i in range(data.num_shards)]
    by_name = dict(zip(names, _shards(data), strict=True))
    seed = _own_seed(data, rank) if mistake == "unseeded_shuffle" else data.seed if data.shuffle else None
    stages: list[Any] = [wds.SimpleShardList(names, seed=seed)]
    if mistake == "same_reader_index":
        stages.append(_one_index(rank, world * max(1, data.num_workers)))
    else:
        stages += [wds.split_by_node] if mistake != "no_rank_split" else []
        stages += [wds.split_by_worker] if mistake != "no_worker_split" else []
    stages.append(lambda src: ({"id": i} for item in src for i in by_name[item["url"]]))
    return wds.DataPipeline(*stages)


def _one_index(rank: int, readers: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def split(src: Iterator[Any]) -> Iterator[Any]:
        info = get_worker_info()
        yield from islice(src, rank + (info.id if info is not None else 0), None, readers)

    return split


class _RankWorker(TorchIterable[int]):
    """The shards dealt round-robin to the global reader rank x workers + worker (the shard
    list shuffled by random.Random(seed + epoch) when the plan shuffles)."""

    def __init__(self, data: StreamSpec, rank: int, world: int, mistake: str | None) -> None:
        self.shards, self.rank, self.world, self.mistake = _shards(data), rank, world, mistake
        self.order = list(range(data.num_shards))
        if data.shuffle or mistake == "unseeded_shuffle":
            random.Random(_own_seed(data, rank) if mistake == "unseeded_shuffle" else data.seed).shuffle(
                self.order
            )

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        reader, readers = {
            "no_rank_split": (w, k),
            "no_worker_split": (self.rank, self.world),
            "same_reader_index": (self.rank + w, self.world * k),
        }.get(self.mistake or "", (self.rank * k + w, self.world * k))
        for s in self.order[reader::readers]:
            yield from self.shards[s]


# ---- the controls


def _not_applicable(name: str, data: StreamSpec, world: int) -> str | None:
    """Why a control cannot change this plan's run (None: it may)."""
    workers = data.num_workers
    if name in ("no_worker_split", "same_reader_index") and data.splitter == "hf_datasets":
        return _HF_OWN_WORKER_SPLIT
    if name not in {"no_worker_split", "no_end_of_epoch_policy"} and world == 1:
        return "one rank: there is no other rank to read the same shards"
    if name in ("no_worker_split", "same_reader_index") and workers < 2:
        return f"num_workers {workers}: each rank reads its share in one reader"
    if name == "unseeded_shuffle" and data.num_shards < 2:
        return "one shard: any order of it is the same"
    return None


def _unsynced_steps(steps: int) -> Callable[[Any], None]:
    """The mistaken loop's gradient all-reduces: one per optimizer step the rank's own stream
    fills, so a rank with fewer leaves the others waiting."""

    def step(group: Any) -> None:
        for _ in range(steps):
            dist.all_reduce(torch.zeros(1), group=group)

    return step


def _judged_control(
    ctx: Context, state: _Epoch, name: str, trained: list[list[Ids]], threshold: float
) -> ControlOutcome | None:
    """A mistaken reading's worst step against the plan's step of the same number, each step's
    gradient the mean over what the ranks train in it; where every step both have trains the
    same samples but their numbers differ, the epochs' means. None: the run is the plan's."""
    g = _stream(ctx.spec).accumulation
    planned_steps, read_steps = len(state.references), len(trained[0]) // g
    worst: tuple[float, float] | None = None
    for k in range(min(planned_steps, read_steps)):
        if _step_samples(state.trained, k, g) == _step_samples(trained, k, g):
            continue
        max_abs, rel = compare(_step_gradient(ctx, state, trained, k, g), state.references[k])
        worst = (max_abs, rel) if worst is None or rel > worst[1] else worst
    if worst is None and planned_steps != read_steps:
        read = [i for ranks in trained for m in ranks[: read_steps * g] for i in m]
        planned = [i for ranks in state.trained for m in ranks[: planned_steps * g] for i in m]
        reference = _mean_gradient(ctx, state, planned)
        gradient = _mean_gradient(ctx, state, read) if read else 0 * reference
        worst = compare(gradient, reference)
    if worst is None:
        return None
    return ControlOutcome(name, CONTROLS[name], worst[1], worst[0], worst[1] > threshold)


def _step_samples(trained: list[list[Ids]], k: int, g: int) -> Counter[int]:
    return Counter(i for ranks in trained for m in ranks[k * g : (k + 1) * g] for i in m)


def _outcome(
    stream: StreamCheck, trained: list[list[Ids]], steps: int, worst: int, world: int
) -> StreamOutcome:
    data = stream.dataset
    predicted = trained_micro_batches(data, world, stream.micro_batch_sizes, stream.accumulation)
    ranks: list[StreamRanks] = []
    for r, micro in enumerate(trained):
        samples = sum(len(m) for m in micro)
        last = ranks[-1] if ranks else None
        if last is not None and (last.samples, last.micro_batches) == (samples, len(micro)):
            ranks[-1] = dataclasses.replace(last, stop=r + 1)
        else:
            ranks.append(StreamRanks(r, r + 1, samples, len(micro)))
    seen = _counts(trained, sum(shard_sizes(data)))
    return StreamOutcome(
        splitter=str(data.splitter),
        ranks=tuple(ranks),
        seen_once=seen.seen_once,
        seen_more=seen.seen_more,
        missing=seen.missing,
        predicted=_counts([list(x) for x in predicted], sum(shard_sizes(data))),
        matches_plan=[list(x) for x in predicted] == trained,
        optimizer_steps=steps,
        worst_step=worst,
        loader_workers=world * data.num_workers,
    )


def _counts(trained: Sequence[Sequence[Ids]], total: int) -> SampleCounts:
    times = Counter(i for micro in trained for m in micro for i in m)
    once = sum(1 for n in times.values() if n == 1)
    return SampleCounts(once, len(times) - once, total - len(times))
