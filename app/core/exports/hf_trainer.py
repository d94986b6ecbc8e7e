"""`hf-trainer`: Hugging Face `TrainingArguments(...)` and `PlanTrainer`, a `Trainer` that runs
the plan's recipe, as Python source.

The Trainer alone cannot: its warmup starts at 0 and its decay ends one step after the run,
its weight decay skips biases and norms, it clips at 1.0 unless told, it has no plain Adam, its
sampler is Accelerate's (which splits batches, not samples, and pads the epoch's end its own
way), and it steps on an epoch's leftover micro-batches. PlanTrainer builds the plan's
optimizer, its lr schedule (batchplan's own function), and a loader over the plan's
`DistributedSampler` that stops at the epoch's last whole optimizer step.
"""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    python_call,
    require_data_parallel,
    require_even,
    summary,
)
from app.core.exports.recipe_code import lr_block, optimizer_call, optimizer_note, recipe, scheduler_call
from app.core.exports.resume_notes import resume_notes
from app.core.exports.training import leftover_sentence


def training_arguments(x: ExportInput) -> dict[str, Any]:
    require_even(x, "the HF Trainer", "takes one per_device_train_batch_size")
    require_data_parallel(x, "the HF Trainer's TrainingArguments")
    p = x.plan
    lr, o = recipe(x)
    values: dict[str, Any] = {
        "output_dir": x.options.job_name,
        "per_device_train_batch_size": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
        "learning_rate": lr.lr,
        "weight_decay": o.weight_decay,
        # Stated also when off: the Trainer's own default clips at 1.0.
        "max_grad_norm": o.max_grad_norm if o.max_grad_norm is not None else 0.0,
        "seed": p.sampler.seed if p.sampler else 0,
    }
    epochs = p.sampler.epochs if p.sampler else None
    full_run = epochs * p.sampler.optimizer_steps_per_epoch if epochs and p.sampler else None
    if epochs is not None:
        values["num_train_epochs"] = epochs
    if lr.train_steps is not None and lr.train_steps != full_run:
        values["max_steps"] = lr.train_steps
    return values


# Under loss_normalization sample; under token the Trainer's num_items_in_batch is the plan's.
_SAMPLE_LOSS = """
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The plan weighs every sample of a step alike: each micro-batch's mean loss divided by
        # the accumulation. A model whose forward takes **kwargs would otherwise be handed
        # num_items_in_batch and normalise by the step's label count instead.
        self.model_accepts_loss_kwargs = False
"""

_TRAINER = '''
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


class PlanTrainer(Trainer):
    """The Trainer with the plan's optimizer, lr schedule and sampler (see the header)."""
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

    def get_train_dataloader(self):
        sampler = DistributedSampler(
            self.train_dataset, num_replicas=self.args.world_size, rank=self.args.process_index,
            shuffle=__SHUFFLE__, seed=__SEED__, drop_last=__DROP_LAST__,
        )
        args = self.args
        batches = PlanBatches(sampler, args.per_device_train_batch_size, args.gradient_accumulation_steps)
        return EpochLoader(self.train_dataset, batch_sampler=batches, collate_fn=self.data_collator)
'''


def export_hf_trainer(x: ExportInput) -> Export:
    values = training_arguments(x)
    p = x.plan
    _, o = recipe(x)
    notes = {
        "per_device_train_batch_size": f"x {p.gradient_accumulation_steps} accumulation x "
        f"{p.data_parallel_size} processes = {p.global_batch_size}",
        "learning_rate": "the peak; PlanTrainer's schedule sets every step's",
    }
    if o.max_grad_norm is None:
        notes["max_grad_norm"] = "no clipping (0 turns the Trainer's default of 1.0 off)"
    code = _TRAINER
    token_loss = p.tokens is not None and p.tokens.loss_normalization == "token"
    for token, value in {
        "__INIT__": "" if token_loss else _SAMPLE_LOSS,
        "__NOTE__": optimizer_note(x) or f"torch.optim.{o.torch_class}, every parameter in one group",
        "__OPTIMIZER__": optimizer_call(x, "(model or self.model).parameters()"),
        "__SCHEDULER__": scheduler_call(x, "optimizer or self.optimizer"),
        "__SHUFFLE__": repr(p.sampler.shuffle if p.sampler else True),
        "__SEED__": repr(p.sampler.seed if p.sampler else 0),
        "__DROP_LAST__": repr(p.sampler.drop_last if p.sampler else False),
    }.items():
        code = code.replace(token, value)
    header = summary(x) + leftover_sentence(x, "PlanTrainer's loader stops before them")
    header += resume_notes(x, "hf-trainer")
    text = "\n".join(
        [
            comment(header),
            "# Launch with torchrun (see the torchrun export); the Trainer reads the world size from it.",
            "# Train with PlanTrainer(model=..., args=training_args, train_dataset=...): the Trainer alone",
            "# would warm up from 0, decay weights but not biases, sample through Accelerate's own batch",
            "# split and step on each epoch's leftover micro-batches.",
            "import itertools",
            "import math",
            "",
            "import torch",
            "from torch.utils.data import BatchSampler, DataLoader, DistributedSampler",
            "from transformers import Trainer, TrainingArguments",
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
