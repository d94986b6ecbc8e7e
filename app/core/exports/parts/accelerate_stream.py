"""The accelerate export's training function for a stream plan: the whole `datasets` stream split
once by split_dataset_by_node in a DataLoader kept out of `accelerator.prepare` (which would read
it on rank 0 alone, or split it again), cut each epoch at the plan's count (end_of_epoch "drop")."""

from __future__ import annotations

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.parts.hf_trainer_stream import epoch_micro_batches, require_trainer_stream
from app.core.exports.parts.python_literal import py_literal

# train()'s optimizer and scheduler, and one micro-batch's step under accumulate(): the same
# in the accelerate export's train() for a map-style plan (accelerate.py), so both take these.
PREPARE = """\
    optimizer = __OPTIMIZER__
    model, optimizer = accelerator.prepare(model, optimizer)
    # Not prepared: stepped below once per optimizer step, planned_lr(step) being step `step`'s lr.
    scheduler = __SCHEDULER__
"""
ACCUMULATE_STEP = """\
            with accelerator.accumulate(model):
                inputs, targets = inputs.to(accelerator.device), targets.to(accelerator.device)
                accelerator.backward(loss_fn(model(inputs), targets))  # divides by the accumulation
__CLIP__                optimizer.step()  # only after the last micro-batch of a step
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                scheduler.step()
"""

TRAIN_STREAM = (
    '''
def train(model, stream, loss_fn, collate_fn=None):
    """Train `model` on `stream`, the whole datasets.IterableDataset of __NUM_SHARDS__ shards, whose
    micro-batches (collate_fn's) are (inputs, targets), with the plan's recipe."""
    accelerator = Accelerator(gradient_accumulation_steps=__ACCUM__)
    if accelerator.num_processes != __WORLD__:
        raise ValueError(f"planned for __WORLD__ processes, launched on {accelerator.num_processes}")
    if stream.n_shards != __NUM_SHARDS__:
        raise ValueError(f"the stream has {stream.n_shards} shards, the plan __NUM_SHARDS__: plan again")
__SHUFFLE__    # Split here, once; datasets then splits the rank's shards over its DataLoader workers.
    rank, world = accelerator.process_index, accelerator.num_processes
    stream = split_dataset_by_node(stream, rank=rank, world_size=world)
    # Not prepared: per process, read by its own workers.
    loader = DataLoader(stream, batch_size=__MICRO__, collate_fn=collate_fn, num_workers=__WORKERS__)
    # Each epoch's micro-batches, up to the last whole optimizer step every rank reaches (the
    # plan's end_of_epoch "drop"): no rank runs dry while the others wait in an all-reduce.
    micro_batches = __MICRO_BATCHES__
    # __NOTE__
'''
    + PREPARE
    + """    step = 0
    for epoch in range(__EPOCHS__):
        stream.set_epoch(epoch)  # orders the shards (shuffle) by seed and epoch
        count = micro_batches[min(epoch, len(micro_batches) - 1)]
        for inputs, targets in itertools.islice(loader, count):
"""
    + ACCUMULATE_STEP
    + """                step += 1
                if step == __TRAIN_STEPS__:  # the run's last optimizer step
                    return model
    return model
"""
)

_SHUFFLE = """\
    # The shard order only, the same on every rank: a larger buffer also mixes samples within a
    # worker and, with fewer shards than ranks, changes which samples a rank keeps.
    stream = stream.shuffle(seed=__SEED__, buffer_size=1, max_buffer_input_shards=1)
"""


def stream_train_code(x: ExportInput) -> tuple[str, int]:
    """(the train() function with the stream's fields filled, the run's optimizer steps); the
    recipe's tokens (__NOTE__, __OPTIMIZER__, __SCHEDULER__, __CLIP__, __ACCUM__) are left to
    the caller."""
    require_trainer_stream(x)
    dataset = x.request.dataset
    assert dataset is not None and dataset.stream is not None
    spec = dataset.stream
    counts, steps = epoch_micro_batches(x)
    accumulation = x.plan.gradient_accumulation_steps
    epochs, done = 0, 0
    while done < steps:  # the epochs the run reaches into
        more = counts[min(epochs, len(counts) - 1)] // accumulation
        if not more and epochs >= len(counts):
            break
        done, epochs = done + more, epochs + 1
    code = TRAIN_STREAM
    for token, value in {
        "__SHUFFLE__": _SHUFFLE.replace("__SEED__", py_literal(spec.seed)) if spec.shuffle else "",
        "__WORLD__": str(x.plan.data_parallel_size),
        "__NUM_SHARDS__": str(spec.num_shards),
        "__MICRO__": str(x.plan.micro_batch_size),
        "__WORKERS__": str(spec.num_workers),
        "__MICRO_BATCHES__": py_literal(list(counts)),
        "__EPOCHS__": str(epochs),
        "__TRAIN_STEPS__": str(steps),
    }.items():
        code = code.replace(token, value)
    return code, steps
