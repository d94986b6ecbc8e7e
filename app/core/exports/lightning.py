"""`lightning`: PyTorch Lightning `Trainer(...)` and `DataLoader(...)` as Python source."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    num_nodes,
    python_call,
    require_data_parallel,
    require_even,
    require_uniform_nodes,
    summary,
)
from app.core.exports.training import leftover_micro_batches, optimizer_sentence, schedule_sentence


def export_lightning(x: ExportInput) -> Export:
    # The node shape first: no batch size makes nodes of different sizes one process count.
    shape = require_uniform_nodes(x, "Lightning")
    require_even(x, "Lightning", "gives every process the same DataLoader batch size")
    require_data_parallel(x, "Lightning's ddp strategy")
    p = x.plan
    trainer: dict[str, Any] = {
        "accelerator": "gpu",
        "devices": shape,
        "num_nodes": num_nodes(x),
        "strategy": "ddp",
        "accumulate_grad_batches": p.gradient_accumulation_steps,
        "use_distributed_sampler": True,
    }
    notes = {}
    if p.sampler is not None and p.sampler.epochs is not None:
        trainer["max_epochs"] = p.sampler.epochs
    if leftover_micro_batches(x) and p.sampler is not None:
        # Lightning steps on the last batch of an epoch even mid-accumulation; stopping the
        # epoch at the plan's last whole step keeps its step count (and the lr warmup's pace).
        trainer["limit_train_batches"] = p.sampler.optimizer_steps_per_epoch * p.gradient_accumulation_steps
        notes["limit_train_batches"] = (
            f"{p.sampler.optimizer_steps_per_epoch} optimizer steps per epoch, as planned; the "
            f"{leftover_micro_batches(x)} micro-batches after them are skipped"
        )
    loader = {"batch_size": p.micro_batch_size, "shuffle": p.sampler.shuffle if p.sampler else True}
    lines = [
        comment(summary(x)),
        "# Lightning swaps in a DistributedSampler and divides the loss by accumulate_grad_batches.",
        "import lightning as L",
        "from torch.utils.data import DataLoader",
        "",
        python_call("trainer = L.Trainer", trainer, notes),
        # The dataset is a name in the user's code, not a value: written as None, then renamed.
        python_call(
            "train_loader = DataLoader", {"dataset": None, **loader}, {"dataset": "your Dataset"}
        ).replace("dataset=None", "dataset=train_dataset"),
    ]
    if p.learning_rate is not None:
        lines.append(
            f"# configure_optimizers: {optimizer_sentence(x)}; {schedule_sentence(x)}, stepped every "
            f"optimizer step (interval 'step')"
        )
    return Export("lightning", "text/plain", "lightning_trainer.py", "\n".join(lines) + "\n")
