"""`torchtitan`: a TOML job config for torchtitan's `--job.config_file` (written against
torchtitan 0.2.2's JobConfig: `training.local_batch_size` sequences per micro-batch per
data-parallel rank, `training.global_batch_size` per step, `training.seq_len`, and the
`parallelism.*` degrees). torchtitan derives the accumulation as global / (local x batch
degree), the batch degree being data_parallel_replicate x data_parallel_shard: the plan's
device mesh gives both (DDP: replicate only; FSDP: shard only; HSDP: both).
"""

from __future__ import annotations

import json
import math

from app.core.exports.parts.common import comment, require_even, require_hf_datasets_splitter, summary
from app.core.exports.parts.export_types import Export, ExportInput, ExportUnsupported
from app.core.exports.parts.packed_tools import torchtitan_packed_notes
from app.core.exports.parts.training import optimizer_settings, run_length, warmup_field
from app.core.records.plan import LearningRatePlan

# torchtitan 0.2.2 builds these two optimizers only (components/optimizer.py).
_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}


def _value(value: object) -> str:
    # TOML's strings, integers, floats and booleans are JSON's spellings of them, but infinity.
    return "inf" if value == math.inf else json.dumps(value)


def lr_scheduler(lr: LearningRatePlan, warmup_field: str) -> dict[str, object]:
    """The plan's schedule as torchtitan's [lr_scheduler] (components/lr_scheduler.py), or a
    refusal. torchtitan's warmup factor at step k is (k + 1) / warmup_steps, and one stable step
    follows its warmup before the decay (progress (k - warmup_steps) / decay steps). So a warmup
    of W from the plan's start s to p is torchtitan's warmup_steps W + 1 when s = p / (W + 1),
    and a decay matches the plan's only without warmup (total_steps the last step L)."""
    start, peak, warmup = lr.warmup_start_lr, lr.lr, lr.warmup_steps
    last = lr.train_steps - 1 if lr.train_steps else None
    decay = lr.decay
    if decay in ("linear", "cosine") and (last is None or last <= warmup):
        decay = "constant"  # the run ends before any decay
    if decay == "step":
        raise ExportUnsupported(
            "torchtitan's lr_scheduler has no step decay (it decays linear, sqrt or cosine): choose "
            "cosine or linear decay",
            pointer="/learning_rate/decay",
        )
    if decay == "constant":
        if not warmup:
            return {"warmup_steps": 0, "decay_ratio": 0.0}
        torchtitans = peak / (warmup + 1)
        if not math.isclose(start, torchtitans, rel_tol=1e-12):
            raise ExportUnsupported(
                f"torchtitan's warmup starts at lr / (warmup_steps + 1) = {torchtitans!r} and rises by as "
                f"much each step, the plan's at warmup_start_lr {start!r}: set warmup_start_lr to "
                f"{torchtitans!r}, or leave the warmup out",
                pointer="/learning_rate/warmup_start_lr",
            )
        # decay_ratio 0: constant after warmup.
        return {"warmup_steps": warmup + 1, "decay_ratio": 0.0}
    if warmup:
        raise ExportUnsupported(
            f"torchtitan holds the peak lr one step between its warmup and its decay, so after a "
            f"warmup its {decay} decay runs a step behind the plan's: decay without warmup, or warm "
            f"up and keep the lr constant",
            pointer="/learning_rate/decay",
            suggestions={f"learning_rate.{warmup_field}": [0]},
        )
    assert last is not None
    return {"warmup_steps": 0, "decay_type": decay, "min_lr_factor": lr.min_lr / peak, "total_steps": last}


def stream_tables(x: ExportInput, training: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    """A stream plan's [training.dataloader] and notes, or a refusal. torchtitan 0.2.2's training
    loader (hf_datasets/text_datasets.py, build_text_dataloader) splits with
    split_dataset_by_node(ds, dp_rank, dp_world_size) and always repeats its stream
    (infinite=True, no config key; each pass set_epoch(epoch + 1)): the run ends at
    training.steps, as end_of_epoch "steps" plans it."""
    stream, dataset = x.plan.stream, x.request.dataset
    assert stream is not None and dataset is not None and dataset.stream is not None
    spec = dataset.stream
    require_hf_datasets_splitter(x, "torchtitan's loader splits its stream")
    if spec.end_of_epoch != "steps":
        raise ExportUnsupported(
            "torchtitan's training loader repeats its stream for ever (build_text_dataloader's "
            f"infinite=True, no config key) and stops at training.steps: it cannot {spec.end_of_epoch} an "
            'epoch\'s end; plan end_of_epoch "steps" with a step count',
            pointer="/dataset/end_of_epoch",
        )
    if "steps" not in training:
        raise ExportUnsupported(
            "a repeating stream has no end of its own: torchtitan runs training.steps optimizer steps; "
            "give learning_rate.train_steps",
            pointer="/learning_rate/train_steps",
        )
    notes = [
        f"the stream repeats (torchtitan's training loader loops it, set_epoch(epoch + 1) each pass: no key "
        f"to set) and the run is training.steps = {training['steps']} optimizer steps; an epoch of it is "
        f"about {stream.optimizer_steps_per_epoch}",
        f"split_dataset_by_node over the {x.plan.data_parallel_size} data-parallel ranks reads "
        + (
            "whole shards"
            if stream.branch == "shards"
            else "every shard on every rank, keeping 1 sample in each data-parallel rank's turn"
        )
        + (
            "; shard counts that give every reader equal work: "
            + ", ".join(map(str, stream.suggested_num_shards))
            if stream.suggested_num_shards
            else ""
        ),
        "torchtitan packs each rank's documents into rows of training.seq_len tokens: a micro-batch is "
        "local_batch_size rows, not samples",
        "training.dataset and training.dataset_path name your stream (load_dataset(..., streaming=True))",
    ]
    return {"num_workers": spec.num_workers}, notes


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
    if run_length(x):
        training["steps"] = run_length(x)
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
    if p.stream is not None:
        dataloader, stream_notes = stream_tables(x, training)
        tables["training.dataloader"] = dataloader
        notes += stream_notes
    notes.append(
        "torchtitan divides each step's summed token loss by its global valid-token count, "
        "whatever the plan's loss_normalization"
    )
    notes += torchtitan_packed_notes(x)
    lr, o = p.learning_rate, optimizer_settings(x)
    if lr is not None and o is not None:
        if o.name not in _OPTIMIZERS or o.betas is None:
            raise ExportUnsupported(
                f"torchtitan builds Adam or AdamW only, not {o.name}: choose adam or adamw",
                pointer="/learning_rate/optimizer",
            )
        tables["optimizer"] = {
            "name": _OPTIMIZERS[o.name],
            "lr": lr.lr,
            "beta1": o.betas[0],
            "beta2": o.betas[1],
            "eps": o.eps,
            "weight_decay": o.weight_decay,  # torchtitan's default is 0.1
        }
        tables["lr_scheduler"] = lr_scheduler(lr, warmup_field(x))
        # torchtitan always clips, at 1.0 by default: infinity leaves the gradient as it is.
        training["max_norm"] = o.max_grad_norm if o.max_grad_norm is not None else math.inf
    return tables, notes


def export_torchtitan(x: ExportInput) -> Export:
    tables, notes = torchtitan_tables(x)
    lines = [comment(summary(x) + [f"note: {n}" for n in notes]), ""]
    for name, values in tables.items():
        lines += _table(name, values)
    return Export("torchtitan", "application/toml", "batchplan.toml", "\n".join(lines))
