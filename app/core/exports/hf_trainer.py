"""`hf-trainer`: Hugging Face `TrainingArguments(...)` and `PlanTrainer`, a `Trainer` that runs
the plan's recipe, as Python source.

The arguments say what TrainingArguments can (hf_trainer_args.py): the optimizer with its
betas, eps or momentum, the weight decay, the clipping (stated when off: the Trainer clips at 1.0
unless told), the lr schedule, the run's length. A plain Trainer(args=training_args) still decays
weights but not biases and norms, has no plain Adam with weight decay nor step decay nor every
warmup, samples through Accelerate (which splits batches, not samples, and pads the epoch's end
its own way), and steps on an epoch's leftover micro-batches: the header lists what it gets
wrong for this plan. PlanTrainer builds the plan's optimizer, its lr schedule (batchplan's own
function), and a loader over the plan's `DistributedSampler` that stops at the epoch's last
whole optimizer step; for a stream plan, a loader that splits the stream once
(parts/hf_trainer_stream.py).
"""

from __future__ import annotations

import textwrap
from typing import Any

from app.core.exports.parts.common import comment, python_call, require_data_parallel, require_even, summary
from app.core.exports.parts.export_types import Export, ExportInput
from app.core.exports.parts.hf_trainer_args import data_differences, optimizer_arguments, schedule_arguments
from app.core.exports.parts.hf_trainer_packed import (
    PACKED_CODE,
    PACKED_INIT,
    packed_arguments,
    packed_wrong,
    require_rows,
)
from app.core.exports.parts.hf_trainer_stream import (
    require_trainer_stream,
    stream_arguments,
    stream_loader_code,
    stream_notes,
    stream_wrong,
)
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import (
    lr_block,
    optimizer_call,
    optimizer_note,
    recipe,
    scheduler_call,
)
from app.core.exports.parts.resume_notes import resume_notes
from app.core.exports.parts.training import leftover_sentence


def training_arguments(x: ExportInput) -> tuple[dict[str, Any], list[str]]:
    """(TrainingArguments' values, what a plain Trainer on them gets wrong)."""
    require_even(x, "the HF Trainer", "takes one per_device_train_batch_size")
    require_data_parallel(x, "the HF Trainer's TrainingArguments")
    require_rows(x.request)
    p = x.plan
    if p.stream is not None:
        require_trainer_stream(x)
    lr, o = recipe(x)
    optimizer, wrong_optimizer = optimizer_arguments(x)
    schedule, wrong_lr = schedule_arguments(lr)
    values: dict[str, Any] = {
        "output_dir": x.options.job_name,
        "per_device_train_batch_size": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
        "learning_rate": lr.lr,
        **optimizer,
        # Stated also when off: the Trainer's own default clips at 1.0.
        "max_grad_norm": o.max_grad_norm if o.max_grad_norm is not None else 0.0,
        **schedule,
        "seed": p.sampler.seed if p.sampler else 0,
    }
    if p.stream is not None:
        values |= stream_arguments(x)[0]
        return values, wrong_optimizer + wrong_lr + stream_wrong(x)
    if lr.train_steps is not None:
        values["max_steps"] = lr.train_steps  # it overrides num_train_epochs
    elif p.sampler and p.sampler.epochs is not None:
        values["num_train_epochs"] = p.sampler.epochs
    wrong = wrong_optimizer + wrong_lr + data_differences(x)
    if x.request.packing is not None:
        values |= packed_arguments(x)[0]
        wrong += packed_wrong()
    return values, wrong


# Under loss_normalization sample; under token the Trainer's num_items_in_batch is the plan's.
_SAMPLE_LOSS = """
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The plan weighs every sample of a step alike: each micro-batch's mean loss divided by
        # the accumulation. A model whose forward takes **kwargs would otherwise be handed
        # num_items_in_batch and normalise by the step's label count instead.
        self.model_accepts_loss_kwargs = False
"""

_MAP_LOADER = '''
class PlanBatches(BatchSampler):
    """One epoch's micro-batches of the plan's sampler, up to its last whole optimizer step:
    the micro-batches left over after it are dropped, as the plan does (sampler.leftover)."""

    def __init__(self, sampler, batch_size: int, accumulation: int) -> None:
        super().__init__(sampler, batch_size, drop_last=False)
        micro_steps = -(-len(sampler) // batch_size)
        self.micro_steps = micro_steps // accumulation * accumulation

    def __len__(self) -> int:
        return self.micro_steps

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.micro_steps)


class EpochLoader(DataLoader):
    """The Trainer calls set_epoch on its loader every epoch: the sampler reshuffles with seed + epoch."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.sampler.set_epoch(epoch)
'''

_TRAINER = '''

class PlanTrainer(Trainer):
    """The Trainer with the plan's optimizer, lr schedule and __DATA__ (see the header)."""
__INIT__
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            # __NOTE__
            self.optimizer = __OPTIMIZER__
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            # The Trainer steps it once per optimizer step: planned_lr(step) is step `step`'s lr.
            self.lr_scheduler = __SCHEDULER__
        return self.lr_scheduler

__DATALOADER__'''

_MAP_DATALOADER = """    def get_train_dataloader(self):
        sampler = DistributedSampler(
            self.train_dataset, num_replicas=self.args.world_size, rank=self.args.process_index,
            shuffle=__SHUFFLE__, seed=__SEED__, drop_last=__DROP_LAST__,
        )
        args = self.args
        batches = PlanBatches(sampler, args.per_device_train_batch_size, args.gradient_accumulation_steps)
        return EpochLoader(self.train_dataset, batch_sampler=batches, collate_fn=self.data_collator)
"""


def _notes(x: ExportInput, values: dict[str, Any]) -> dict[str, str]:
    p = x.plan
    _, o = recipe(x)
    notes = {
        "per_device_train_batch_size": f"x {p.gradient_accumulation_steps} accumulation x "
        f"{p.data_parallel_size} processes = {p.global_batch_size}",
        "learning_rate": "the peak; PlanTrainer's schedule sets every step's",
        "max_steps": "the run's optimizer steps: the schedule's length, and where the Trainer stops",
    }
    s = p.sampler
    if (
        "max_steps" in values
        and s
        and s.epochs
        and values["max_steps"] == s.epochs * s.optimizer_steps_per_epoch
    ):
        notes["max_steps"] = (
            f"{s.epochs} epochs of {s.optimizer_steps_per_epoch} optimizer steps: the schedule's length, "
            "and where the Trainer stops"
        )
    if o.max_grad_norm is None:
        notes["max_grad_norm"] = "no clipping (0 turns the Trainer's default of 1.0 off)"
    if values["optim"] == "adamw_torch" and o.name == "adam" and not o.weight_decay:
        notes["optim"] = "torch.optim.AdamW without weight decay: the plan's Adam"
    elif o.name in ("lars", "lamb"):
        notes["optim"] = f"torch has no {o.name.upper()}: {o.torch_class} stands in, as in PlanTrainer"
    if values.get("lr_scheduler_type") == "cosine_warmup_with_min_lr":
        notes["warmup_steps"] = "it reaches the peak at warmup_steps - 1: the plan's warmup + 1"
    if x.request.packing is not None:
        notes |= packed_arguments(x)[1]
    if p.stream is not None:
        notes |= stream_arguments(x)[1]
    return notes


def _listed(sentences: list[str]) -> list[str]:
    """Each sentence a '# - ' item, wrapped under itself."""
    out = []
    for sentence in sentences:
        lines = textwrap.wrap(sentence, 92)
        out += [f"# - {lines[0]}", *(f"#   {line}" for line in lines[1:])]
    return out


_MAP_IMPORTS = ["from torch.utils.data import BatchSampler, DataLoader, DistributedSampler"]
_STREAM_IMPORTS = [
    "from datasets.distributed import split_dataset_by_node",
    "from torch.utils.data import DataLoader",
]
_STREAM_USE = [
    "# Train with PlanTrainer(model=..., args=training_args, train_dataset=stream), stream the whole",
    "# datasets.IterableDataset (load_dataset(..., streaming=True)): PlanTrainer splits it. training_args",
]


def _train_line(packed: bool) -> list[str]:
    return [
        "# Train with PlanTrainer(model=..., args=training_args, train_dataset="
        + ("pack_rows(documents)). training_args" if packed else "...). training_args")
    ]


def export_hf_trainer(x: ExportInput) -> Export:
    values, wrong = training_arguments(x)
    p = x.plan
    _, o = recipe(x)
    notes = _notes(x, values)
    packed = x.request.packing is not None
    if p.stream is not None:
        loader, dataloader = stream_loader_code(x, stream_arguments(x)[2])
    else:
        loader, dataloader = _MAP_LOADER, _MAP_DATALOADER
    code = (PACKED_CODE if packed else "") + loader + _TRAINER.replace("__DATALOADER__", dataloader)
    token_loss = p.tokens is not None and p.tokens.loss_normalization == "token"
    for token, value in {
        "__SEQ__": py_literal(x.request.sequence_length),
        "__INIT__": PACKED_INIT if packed else "" if token_loss else _SAMPLE_LOSS,
        "__NOTE__": optimizer_note(x) or f"torch.optim.{o.torch_class}, every parameter in one group",
        "__OPTIMIZER__": optimizer_call(x, "(model or self.model).parameters()"),
        "__SCHEDULER__": scheduler_call(x, "optimizer or self.optimizer"),
        "__SHUFFLE__": py_literal(p.sampler.shuffle if p.sampler else True),
        "__SEED__": py_literal(p.sampler.seed if p.sampler else 0),
        "__DROP_LAST__": py_literal(p.sampler.drop_last if p.sampler else False),
        "__DATA__": "stream loader" if p.stream is not None else "sampler",
    }.items():
        code = code.replace(token, value)
    header = summary(x) + leftover_sentence(x, "PlanTrainer's loader stops before them")
    header += stream_notes(x) if p.stream is not None else []
    header += resume_notes(x, "hf-trainer")
    collator = "DataCollatorWithFlattening, " if packed else ""
    text = "\n".join(
        [
            comment(header),
            "# Launch with torchrun (see the torchrun export); the Trainer reads the world size from it.",
            *(_STREAM_USE if p.stream is not None else _train_line(packed)),
            "# holds what TrainingArguments can say of the recipe: a plain Trainer(args=training_args)",
            "# trains with it, except that",
            *_listed(wrong),
            "# and PlanTrainer does each as planned.",
            "import itertools",
            "import math",
            "",
            "import torch",
            *(_STREAM_IMPORTS if p.stream is not None else _MAP_IMPORTS),
            f"from transformers import {collator}Trainer, TrainingArguments",
            "",
            python_call("training_args = TrainingArguments", values, notes),
            "",
            "",
            lr_block(x),
            "",
            code,
        ]
    )
    return Export("hf-trainer", "text/plain", "training_args.py", text)
