"""The hf-trainer export of a stream plan: TrainingArguments for an IterableDataset and
PlanTrainer's loader, which splits the stream once with `datasets`' split_dataset_by_node (the
accelerate export's train() splits and cuts it the same way, with these refusals and counts).

Left to the Trainer, the loader goes through `accelerator.prepare` (accelerate 1.16's
prepare_data_loader): by default (dispatch_batches is None, so True for an IterableDataset)
rank 0 reads the stream and hands out slices of its batches, and with dispatch_batches False it
splits the stream again (`IterableDataset.shard(num_processes, process_index)` when it has as
many shards as processes, else an IterableDatasetShard of batches). A stream split by the user
would be read by rank 0 alone or split twice. PlanTrainer therefore builds its own loader, which
the Trainer takes as it is, as for the map-style plan's sampler. The Trainer has no end-of-epoch
policy for ranks of unequal counts (the first to run dry starts its next epoch while the others
still step), so the loader stops every rank at the plan's count of the epoch: end_of_epoch
"drop", the only policy it runs; the others are refused.
"""

from __future__ import annotations

from typing import Any

from app.core.exports.parts.common import require_hf_datasets_splitter
from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import recipe
from app.core.records.stream import StreamSpec
from app.core.split.stream.plan import plan_stream

# A shuffled stream's count can change with its shard order, epoch by epoch: the loader is told
# each epoch's, for this many epochs at most (the run's last count repeats after them).
_MAX_LISTED_EPOCHS = 1000

STREAM_LOADER = '''
class PlanStream(DataLoader):
    """The rank's share of the stream, cut at the epoch's last whole optimizer step that every
    rank reaches (end_of_epoch "drop"): the plan counts every rank's micro-batches, so no rank
    has to ask the others where the epoch ends."""

    def __init__(self, dataset, micro_batches, **kwargs) -> None:
        super().__init__(dataset, **kwargs)
        self.micro_batches, self.epoch = micro_batches, 0

    def set_epoch(self, epoch: int) -> None:
        # The Trainer calls it each epoch; datasets orders the shards by it (without it every
        # shuffled epoch repeats the first).
        self.epoch = epoch
        self.dataset.set_epoch(epoch)

    def __iter__(self):
        count = self.micro_batches[min(self.epoch, len(self.micro_batches) - 1)]
        return itertools.islice(super().__iter__(), count)
'''

STREAM_DATALOADER = """    def get_train_dataloader(self):
        # train_dataset is the whole stream: it is split here, once, and the loader is not
        # handed to accelerator.prepare, which would read it on rank 0 alone or split it again.
        args, ds = self.args, self.train_dataset
        if args.world_size != __WORLD__:
            raise ValueError(f"planned for __WORLD__ processes, launched on {args.world_size}: plan again")
        if ds.n_shards != __NUM_SHARDS__:
            raise ValueError(f"the stream has {ds.n_shards} shards, the plan __NUM_SHARDS__: plan again")
__SHUFFLE__        # Shards when __NUM_SHARDS__ % world_size == 0, else every rank reads all and keeps 1 in
        # world_size; datasets then splits the rank's shards over its DataLoader workers itself.
        ds = split_dataset_by_node(ds, rank=args.process_index, world_size=args.world_size)
        collate = self._get_collator_with_removed_columns(self.data_collator, description="Training")
        return PlanStream(
            ds, __MICRO_BATCHES__, batch_size=args.per_device_train_batch_size, collate_fn=collate,
            num_workers=args.dataloader_num_workers,
        )
"""

_SHUFFLE = """\
        # The shard order only, the same on every rank: a larger buffer also mixes samples
        # within a worker and, with fewer shards than ranks, changes which samples a rank keeps.
        ds = ds.shuffle(seed=__SEED__, buffer_size=1, max_buffer_input_shards=1)
"""


def _spec(x: ExportInput) -> StreamSpec:
    dataset = x.request.dataset
    assert dataset is not None and dataset.stream is not None
    return dataset.stream


def require_trainer_stream(x: ExportInput) -> None:
    """Refuses what PlanTrainer's loader cannot run: another splitter, another policy."""
    require_hf_datasets_splitter(x, "the hf-trainer export splits the stream")
    spec = _spec(x)
    if spec.end_of_epoch != "drop":
        raise ExportUnsupported(
            "the Trainer has no end-of-epoch policy for ranks of unequal counts (the first to run dry "
            "starts its next epoch while the others still step): PlanTrainer's loader stops every rank at "
            f"the plan's count, as \"drop\" does; it cannot {spec.end_of_epoch} an epoch's end, which needs "
            'the ranks to agree each step (the python export\'s loop): plan end_of_epoch "drop"',
            pointer="/dataset/end_of_epoch",
        )


def _epochs(x: ExportInput) -> int:
    dataset = x.request.dataset
    return dataset.epochs if dataset is not None and dataset.epochs else 1


def epoch_micro_batches(x: ExportInput) -> tuple[tuple[int, ...], int]:
    """(each epoch's micro-batches every rank trains, whole optimizer steps; the run's optimizer
    steps). One count unless the shard order is shuffled, which can change the ranks' counts
    epoch by epoch. The run is the schedule's length, else the planned epochs."""
    p, spec = x.plan, _spec(x)
    assert p.stream is not None and p.micro_batch_size is not None
    lr, _ = recipe(x)
    accumulation = p.gradient_accumulation_steps
    first = p.stream.optimizer_steps_per_epoch
    if not spec.shuffle:
        return (first * accumulation,), lr.train_steps if lr.train_steps is not None else first * _epochs(x)
    steps, done = [first], first
    while len(steps) < _MAX_LISTED_EPOCHS and (
        done < lr.train_steps if lr.train_steps is not None else len(steps) < _epochs(x)
    ):
        epoch = plan_stream(spec, p.data_parallel_size, p.micro_batch_size, accumulation, epoch=len(steps))
        steps.append(epoch.optimizer_steps_per_epoch)
        done += steps[-1]
    return tuple(n * accumulation for n in steps), lr.train_steps if lr.train_steps is not None else done


def stream_arguments(x: ExportInput) -> tuple[dict[str, Any], dict[str, str], tuple[int, ...]]:
    """(TrainingArguments' values, their notes, each epoch's micro-batches)."""
    spec, stream = _spec(x), x.plan.stream
    assert stream is not None
    counts, steps = epoch_micro_batches(x)
    values: dict[str, Any] = {
        "max_steps": steps,
        "dataloader_num_workers": spec.num_workers,
        "seed": spec.seed,
    }
    idle = sum(g.idle_workers * g.count for g in stream.rank_groups)
    workers = f"DataLoader workers per rank; datasets gives each its shards ({idle} idle in all)"
    notes = {
        "max_steps": "a stream has no length: the Trainer runs this many optimizer steps "
        f"({stream.optimizer_steps_per_epoch} an epoch of the plan's shard order)",
        "dataloader_num_workers": workers
        if idle
        else "DataLoader workers per rank; datasets gives each its shards",
    }
    return values, notes, counts


def stream_wrong(x: ExportInput) -> list[str]:
    """What a plain Trainer does to the stream."""
    return [
        "its loader goes through accelerator.prepare, which reads an IterableDataset on rank 0 alone and "
        "hands out slices (dispatch_batches, the default), or with dispatch_batches=False splits it again "
        "(IterableDataset.shard, or IterableDatasetShard under fewer shards than processes): a stream split "
        "by split_dataset_by_node would be read by rank 0 alone or split twice",
        "it has no end-of-epoch policy: the first rank to run dry starts its next epoch while the others "
        "still step, its gradient all-reduces paired with their other steps (or left waiting at the end)",
        "a model whose forward takes **kwargs gets num_items_in_batch and normalises the loss by the "
        "step's label count, where PlanTrainer averages each micro-batch's loss (see above)",
    ]


def stream_notes(x: ExportInput, trainer: str = "PlanTrainer") -> list[str]:
    """The header's sentences on the split, the shard advice and the loss of short micro-batches."""
    spec, stream = _spec(x), x.plan.stream
    assert stream is not None
    split = (
        f"split_dataset_by_node deals whole shards: {spec.num_shards} over {x.plan.data_parallel_size} ranks"
        if stream.branch == "shards"
        else f"split_dataset_by_node reads every shard on every rank and keeps 1 sample in "
        f"{x.plan.data_parallel_size}: {spec.num_shards} shards do not divide over the ranks"
    )
    if stream.suggested_num_shards:
        split += "; shard counts that give every reader equal work: " + ", ".join(
            map(str, stream.suggested_num_shards)
        )
    short = any(g.short_micro_batches for g in stream.rank_groups)
    return [
        split,
        f"an epoch: {stream.optimizer_steps_per_epoch} optimizer steps (the plan's shard order); "
        f"{stream.dropped_samples} samples of the stream are not trained (end_of_epoch drop)",
        *(
            [
                f"{trainer} averages each micro-batch's loss: a worker's short last micro-batch weighs its "
                "samples more than the plan's loss_scale_formula does (the python export's loop is exact)"
            ]
            if short
            else []
        ),
    ]


def stream_loader_code(x: ExportInput, counts: tuple[int, ...]) -> tuple[str, str]:
    """(the PlanStream class, PlanTrainer's get_train_dataloader) for the plan."""
    spec = _spec(x)
    method = STREAM_DATALOADER
    for token, value in {
        "__SHUFFLE__": _SHUFFLE.replace("__SEED__", py_literal(spec.seed)) if spec.shuffle else "",
        "__WORLD__": str(x.plan.data_parallel_size),
        "__NUM_SHARDS__": str(spec.num_shards),
        "__MICRO_BATCHES__": py_literal(list(counts)),
    }.items():
        method = method.replace(token, value)
    return STREAM_LOADER, method
