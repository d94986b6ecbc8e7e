"""The `python` export of a stream plan: a DDP loop over an IterableDataset split as the plan's
splitter splits it (`datasets`' split_dataset_by_node, WebDataset's split_by_node and
split_by_worker, or shards dealt to the reader rank x workers + worker), read by the plan's
DataLoader workers, with the plan's end-of-epoch policy agreed by every rank once a step (one
all-reduce that also carries the step's sample count, so short micro-batches weigh exactly)."""

from __future__ import annotations

from app.core.exports.parts.common import require_data_parallel
from app.core.exports.parts.export_types import Export, ExportInput, ExportUnsupported
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import lr_block, optimizer_call, recipe, scheduler_call
from app.core.exports.python_source.skeleton_source import render_skeleton
from app.core.exports.python_source.stream_source import STREAM_SKELETON


def export_stream_python(x: ExportInput) -> Export:
    """The stream loop: the placeholders (a generated stream of sample ids in TOY mode), never a
    model factory (a factory returns a map-style dataset, which has no shards to split)."""
    p, stream, dataset = x.plan, x.plan.stream, x.request.dataset
    assert stream is not None and dataset is not None and dataset.stream is not None
    require_data_parallel(x, "the python skeleton of a stream (plain DDP)")
    if x.options.model_factory is not None:
        raise ExportUnsupported(
            f"model_factory {x.options.model_factory}: a factory returns a map-style dataset, which has no "
            "shards for the stream's splitter; export without model_factory and put your stream into the "
            "skeleton's build_hf_dataset() or read_shard()",
            pointer="/query/model_factory",
        )
    spec = dataset.stream
    lr, _ = recipe(x)
    groups = [(g.start, g.stop, g.micro_batch_size) for g in stream.rank_groups]
    fields = {
        "__WORLD__": str(p.data_parallel_size),
        "__GLOBAL__": str(p.global_batch_size),
        "__ACCUM__": str(p.gradient_accumulation_steps),
        "__GROUPS__": py_literal(groups),
        "__SPLITTER__": py_literal(spec.splitter),
        "__NUM_SHARDS__": str(spec.num_shards),
        "__SHARD_SAMPLES__": py_literal(list(spec.shard_samples) if spec.shard_samples else None),
        "__NUM_SAMPLES__": py_literal(stream.num_samples),
        "__NUM_WORKERS__": str(spec.num_workers),
        "__SHUFFLE__": py_literal(spec.shuffle),
        "__SEED__": py_literal(spec.seed),
        "__END_OF_EPOCH__": py_literal(spec.end_of_epoch),
        "__EPOCHS__": py_literal(dataset.epochs or 1),
        "__TRAIN_STEPS__": py_literal(stream.train_steps),
        "__STEPS_PER_EPOCH__": str(stream.optimizer_steps_per_epoch),
        "__LR__": py_literal(lr.lr),
        "__LR_FUNCTION__": lr_block(x),
        "__OPTIMIZER_CALL__": optimizer_call(x, "params"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
        "__FREED__": "model, net, optimizer, scheduler",
    }
    return render_skeleton(STREAM_SKELETON, x, fields)
