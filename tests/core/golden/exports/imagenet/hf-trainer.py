# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
# learning rate 0.2 (linear rule from 0.1 per 256), warmup 12515 steps from 0.1
# lr schedule: linear warmup from 0.1 to 0.2 over 12515 optimizer steps, then constant 0.2
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: 1 sample per epoch is seen twice: DistributedSampler pads 1281167 to 1281168
# warning: the last micro-batch of each epoch holds 9 of 32 samples per replica, so its samples weigh more in that step's gradient
# Launch with torchrun (see the torchrun export); the Trainer reads the world size from it.
# Train with PlanTrainer(model=..., args=training_args, train_dataset=...). training_args
# holds what TrainingArguments can say of the recipe: a plain Trainer(args=training_args)
# trains with it, except that
# - it samples through Accelerate's own batch split, not the plan's DistributedSampler (shuffle
#   True, seed 0)
# - a model whose forward takes **kwargs gets num_items_in_batch and normalises the loss by the
#   step's label count, where the plan weighs every sample alike
# and PlanTrainer does each as planned.
import itertools
import math

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler
from transformers import Trainer, TrainingArguments

training_args = TrainingArguments(
    output_dir="batchplan",
    per_device_train_batch_size=32,  # x 1 accumulation x 16 processes = 512
    gradient_accumulation_steps=1,
    learning_rate=0.2,  # the peak; PlanTrainer's schedule sets every step's
    optim="sgd",
    optim_args="momentum=0.9,nesterov=False",
    weight_decay=0.0,
    max_grad_norm=0.0,  # no clipping (0 turns the Trainer's default of 1.0 off)
    lr_scheduler_type="warmup_stable_decay",
    warmup_steps=12515,
    lr_scheduler_kwargs={"min_lr_ratio": 0.5, "warmup_type": "linear", "num_decay_steps": 0},
    seed=0,
    max_steps=225270,  # 90 epochs of 2503 optimizer steps: the schedule's length, and where the Trainer stops
)


# The lr of every optimizer step: batchplan's own function (app.core.lr_schedule), so this
# file and the plan's schedule agree step for step.
def lr_at(
    step: int,
    *,
    start: float,
    peak: float,
    warmup: int,
    decay: str = "constant",
    floor: float = 0.0,
    last_step: int | None = None,
    milestones: tuple[int, ...] = (),
    gamma: float = 0.1,
) -> float:
    """The lr of optimizer step `step` (counted from 0).

    Linear warmup from `start` (at step 0) to `peak` (at step `warmup`), then `decay`:
    "constant" stays at `peak`; "linear" and "cosine" reach `floor` at `last_step` (the run's
    last optimizer step) and stay there; "step" multiplies `peak` by `gamma` at each milestone
    step reached (Goyal et al. 2017: x0.1 at epochs 30, 60 and 80).
    """
    if step < warmup:
        return start + (peak - start) * step / warmup
    if decay == "step":
        return peak * gamma ** sum(1 for m in milestones if step >= m)
    if decay == "constant" or last_step is None or last_step <= warmup or step == warmup:
        return peak
    # Written from the floor, so that the last step gives min_lr exactly.
    progress = min((step - warmup) / (last_step - warmup), 1.0)
    if decay == "linear":
        return floor + (peak - floor) * (1 - progress)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def planned_lr(step: int) -> float:
    """The plan's lr at optimizer step `step` (from 0): linear warmup from 0.1 to 0.2 over
    12515 optimizer steps, then constant 0.2.
    """
    return lr_at(step, start=0.1, peak=0.2, warmup=12515)


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

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The plan weighs every sample of a step alike: each micro-batch's mean loss divided by
        # the accumulation. A model whose forward takes **kwargs would otherwise be handed
        # num_items_in_batch and normalise by the step's label count instead.
        self.model_accepts_loss_kwargs = False

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            # torch.optim.SGD, every parameter in one group
            self.optimizer = torch.optim.SGD((model or self.model).parameters(), lr=0.2, momentum=0.9, nesterov=False, weight_decay=0.0)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            # The Trainer steps it once per optimizer step: planned_lr(step) is step `step`'s lr.
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, lambda step: planned_lr(step) / 0.2)
        return self.lr_scheduler

    def get_train_dataloader(self):
        sampler = DistributedSampler(
            self.train_dataset, num_replicas=self.args.world_size, rank=self.args.process_index,
            shuffle=True, seed=0, drop_last=False,
        )
        args = self.args
        batches = PlanBatches(sampler, args.per_device_train_batch_size, args.gradient_accumulation_steps)
        return EpochLoader(self.train_dataset, batch_sampler=batches, collate_fn=self.data_collator)
