# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
# learning rate 0.2 (linear rule from 0.1 per 256), warmup 12515 steps from 0.1
# lr schedule: linear warmup from 0.1 to 0.2 over 12515 optimizer steps, then constant 0.2
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: 1 sample per epoch is seen twice: DistributedSampler pads 1281167 to 1281168
# warning: the last micro-batch of each epoch holds 9 of 32 samples per replica, so its samples weigh more in that step's gradient
# Lightning divides the loss by accumulate_grad_batches and steps the optimizer once per
# accumulation; the hooks below give it the plan's optimizer, lr schedule and sampler.
import math

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

trainer = L.Trainer(
    accelerator="gpu",
    devices=8,
    num_nodes=2,
    strategy="ddp",
    accumulate_grad_batches=1,
    use_distributed_sampler=False,  # plan_train_dataloader: the plan's sampler, seed, shuffle, drop_last
    gradient_clip_val=None,  # no clipping
    max_epochs=90,
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


def plan_optimizers(module):
    """Return this from your LightningModule's configure_optimizers: the plan's optimizer, and its
    lr schedule stepped once per optimizer step (interval "step")."""
    # torch.optim.SGD, every parameter in one group
    optimizer = torch.optim.SGD(module.parameters(), lr=0.2, momentum=0.9, nesterov=False, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / 0.2)
    schedule = {"scheduler": scheduler, "interval": "step", "frequency": 1}
    return {"optimizer": optimizer, "lr_scheduler": schedule}


def plan_train_dataloader(dataset, trainer):
    """Return this from your LightningModule's train_dataloader (trainer: self.trainer): the plan's
    sampler; Lightning calls its set_epoch every epoch."""
    sampler = DistributedSampler(
        dataset, num_replicas=trainer.world_size, rank=trainer.global_rank,
        shuffle=True, seed=0, drop_last=False,
    )
    return DataLoader(dataset, batch_size=32, sampler=sampler)
