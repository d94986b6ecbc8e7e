"""`torchtitan`: a TOML job config for torchtitan's `--job.config_file` (written against
torchtitan 0.2.2's JobConfig: `training.local_batch_size` sequences per micro-batch per
data-parallel rank, `training.global_batch_size` per step, `training.seq_len`, and the
`parallelism.*` degrees). torchtitan derives the accumulation as global / (local x batch
degree), the batch degree being data_parallel_replicate x data_parallel_shard: the plan's
device mesh gives both (DDP: replicate only; FSDP: shard only; HSDP: both).
"""

from __future__ import annotations

import json

from app.core.exports.common import Export, ExportInput, comment, require_even, summary
from app.core.exports.training import optimizer_settings

# torchtitan 0.2.2 builds these two optimizers only (components/optimizer.py).
_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}


def _value(value: object) -> str:
    # TOML's strings, integers, floats and booleans are JSON's spellings of them.
    return json.dumps(value)


def _table(name: str, values: dict[str, object]) -> list[str]:
    return [f"[{name}]", *(f"{key} = {_value(v)}" for key, v in values.items()), ""]


def torchtitan_tables(x: ExportInput) -> tuple[dict[str, dict[str, object]], list[str]]:
    """The TOML tables, and the notes written above them."""
    require_even(x, "torchtitan", "takes one training.local_batch_size for every rank")
    p = x.plan
    assert p.micro_batch_size is not None
    notes: list[str] = []
    training: dict[str, object] = {
        "local_batch_size": p.micro_batch_size,
        "global_batch_size": p.global_batch_size,
    }
    seq = x.request.sequence_length
    if seq is not None:
        training["seq_len"] = seq
    else:
        notes.append("no sequence_length in the plan: torchtitan's seq_len default applies")
    if p.sampler is not None and p.sampler.total_optimizer_steps:
        training["steps"] = p.sampler.total_optimizer_steps
    parallel = x.request.parallelism
    mesh = p.device_mesh
    tables: dict[str, dict[str, object]] = {
        "job": {"description": "batchplan"},
        "training": training,
        "parallelism": {
            "data_parallel_replicate_degree": mesh.data_parallel_replicate if mesh else p.data_parallel_size,
            "data_parallel_shard_degree": mesh.data_parallel_shard if mesh else 1,
            "tensor_parallel_degree": parallel.tensor,
            "pipeline_parallel_degree": parallel.pipeline,
            "context_parallel_degree": parallel.context,
        },
    }
    notes.append(
        "torchtitan divides each step's summed token loss by its global valid-token count, "
        "whatever the plan's loss_normalization"
    )
    lr, o = p.learning_rate, optimizer_settings(x)
    if lr is not None and o is not None:
        optimizer: dict[str, object] = {"lr": lr.lr}
        if o.name in _OPTIMIZERS and o.betas is not None:
            optimizer = {"name": _OPTIMIZERS[o.name], **optimizer, "beta1": o.betas[0], "beta2": o.betas[1]}
            optimizer |= {"eps": o.eps, "weight_decay": 0.0}
        else:
            notes.append(f"torchtitan builds Adam or AdamW only: set optimizer.name for {o.name} yourself")
        tables["optimizer"] = optimizer
        # decay_ratio 0: constant after warmup, the schedule every export writes.
        tables["lr_scheduler"] = {"warmup_steps": lr.warmup_steps, "decay_ratio": 0.0}
        if lr.warmup_steps:
            notes.append(
                f"torchtitan's warmup starts at lr x 1/{lr.warmup_steps}, not at the plan's "
                f"warmup_start_lr {lr.warmup_start_lr!r}"
            )
    return tables, notes


def export_torchtitan(x: ExportInput) -> Export:
    tables, notes = torchtitan_tables(x)
    lines = [comment(summary(x) + [f"note: {n}" for n in notes]), ""]
    for name, values in tables.items():
        lines += _table(name, values)
    return Export("torchtitan", "application/toml", "batchplan.toml", "\n".join(lines))
