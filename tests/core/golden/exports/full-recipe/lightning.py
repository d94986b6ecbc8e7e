# batchplan: 8 GPUs, data-parallel size 8
# global batch 256 = micro-batch 8 x accumulation 4 x 8 replicas
# learning rate 0.001 (none rule from 0.001 per 256), warmup 20 steps from 0.0
# lr schedule: linear warmup from 0.0 to 0.001 over 20 optimizer steps, then cosine decay from 0.001 to 0.0001 at the last step (499)
# optimizer adamw, betas (0.9, 0.999), eps 1e-08, weight decay 0.05, gradient clipping at global norm 1.0
# warning: the last micro-batch of each epoch holds 2 of 8 samples per replica, so its samples weigh more in that step's gradient
# warning: an epoch ends mid-accumulation: its last 2 of 782 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 195 counts whole steps): the plan drops them, and every export skips them
# Lightning divides the loss by accumulate_grad_batches and steps the optimizer once per
# accumulation; the hooks below give it the plan's optimizer, lr schedule and sampler.
import math

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

trainer = L.Trainer(
    accelerator="gpu",
    devices=4,
    num_nodes=2,
    strategy="ddp",
    accumulate_grad_batches=4,
    use_distributed_sampler=False,  # plan_train_dataloader: the plan's sampler, seed, shuffle, drop_last
    gradient_clip_val=1.0,  # of the all-reduced gradient, one global norm
    gradient_clip_algorithm="norm",
    max_epochs=3,
    max_steps=500,
    limit_train_batches=780,  # 195 optimizer steps per epoch, as planned; the 2 micro-batches after them are dropped
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
    """The plan's lr at optimizer step `step` (from 0): linear warmup from 0.0 to 0.001 over 20
    optimizer steps, then cosine decay from 0.001 to 0.0001 at the last step (499).
    """
    return lr_at(step, start=0.0, peak=0.001, warmup=20, decay="cosine", floor=0.0001, last_step=499)


def plan_optimizers(module):
    """Return this from your LightningModule's configure_optimizers: the plan's optimizer, and its
    lr schedule stepped once per optimizer step (interval "step")."""
    # weight decay 0.05 on every parameter, decoupled (AdamW)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / 0.001)
    schedule = {"scheduler": scheduler, "interval": "step", "frequency": 1}
    return {"optimizer": optimizer, "lr_scheduler": schedule}


def plan_train_dataloader(dataset, trainer):
    """Return this from your LightningModule's train_dataloader (trainer: self.trainer): the plan's
    sampler; Lightning calls its set_epoch every epoch."""
    sampler = DistributedSampler(
        dataset, num_replicas=trainer.world_size, rank=trainer.global_rank,
        shuffle=True, seed=0, drop_last=False,
    )
    return DataLoader(dataset, batch_size=8, sampler=sampler)
