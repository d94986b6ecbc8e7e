"""`lightning`: PyTorch Lightning `Trainer(...)` and `DataLoader(...)` as Python source."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    lr_values,
    num_nodes,
    python_call,
    require_even,
    require_uniform_nodes,
    summary,
)


def export_lightning(x: ExportInput) -> Export:
    require_even(x, "Lightning", "gives every process the same DataLoader batch size")
    shape = require_uniform_nodes(x, "Lightning")
    p = x.plan
    trainer: dict[str, Any] = {
        "accelerator": "gpu",
        "devices": shape,
        "num_nodes": num_nodes(x),
        "strategy": "ddp",
        "accumulate_grad_batches": p.gradient_accumulation_steps,
        "use_distributed_sampler": True,
    }
    if p.sampler is not None and p.sampler.epochs is not None:
        trainer["max_epochs"] = p.sampler.epochs
    loader = {"batch_size": p.micro_batch_size, "shuffle": p.sampler.shuffle if p.sampler else True}
    lr, warmup, start = lr_values(x)
    lines = [
        comment(summary(x)),
        "# Lightning swaps in a DistributedSampler and divides the loss by accumulate_grad_batches.",
        "import lightning as L",
        "from torch.utils.data import DataLoader",
        "",
        python_call("trainer = L.Trainer", trainer, {}),
        # The dataset is a name in the user's code, not a value: written as None, then renamed.
        python_call(
            "train_loader = DataLoader", {"dataset": None, **loader}, {"dataset": "your Dataset"}
        ).replace("dataset=None", "dataset=train_dataset"),
    ]
    if lr is not None:
        lines.append(
            f"# configure_optimizers: lr={lr!r}, linear warmup from {start!r} over {warmup} optimizer steps"
        )
    return Export("lightning", "text/plain", "lightning_trainer.py", "\n".join(lines) + "\n")
