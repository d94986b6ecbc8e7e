"""`lightning`: PyTorch Lightning `Trainer(...)`, and the two hooks a LightningModule returns
the plan's recipe from (`configure_optimizers`, `train_dataloader`), as Python source.

Lightning's own DistributedSampler takes its seed from `PL_GLOBAL_SEED` (0 without
`seed_everything`) and never drops the last samples; the export gives Lightning the plan's
sampler instead (`use_distributed_sampler=False`), which Lightning still calls `set_epoch` on.
"""

from __future__ import annotations

from typing import Any

from app.core.exports.parts.common import (
    comment,
    num_nodes,
    python_call,
    require_data_parallel,
    require_even,
    require_uniform_nodes,
    summary,
)
from app.core.exports.parts.export_types import Export, ExportInput
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import (
    lr_block,
    optimizer_call,
    optimizer_note,
    recipe,
    scheduler_call,
)
from app.core.exports.parts.resume_notes import resume_notes
from app.core.exports.parts.training import leftover_micro_batches

_HOOKS = '''

def plan_optimizers(module):
    """Return this from your LightningModule's configure_optimizers: the plan's optimizer, and its
    lr schedule stepped once per optimizer step (interval "step")."""
    # __NOTE__
    optimizer = __OPTIMIZER__
    scheduler = __SCHEDULER__
    schedule = {"scheduler": scheduler, "interval": "step", "frequency": 1}
    return {"optimizer": optimizer, "lr_scheduler": schedule}


def plan_train_dataloader(dataset, trainer):
    """Return this from your LightningModule's train_dataloader (trainer: self.trainer): the plan's
    sampler; Lightning calls its set_epoch every epoch."""
    sampler = DistributedSampler(
        dataset, num_replicas=trainer.world_size, rank=trainer.global_rank,
        shuffle=__SHUFFLE__, seed=__SEED__, drop_last=__DROP_LAST__,
    )
    return DataLoader(dataset, batch_size=__MICRO__, sampler=sampler)
'''


# Over 60 lines: the Trainer call's arguments and the notes beside them follow the plan's fields
# in the order the generated file shows them.
def export_lightning(x: ExportInput) -> Export:
    # The node shape first: no batch size makes nodes of different sizes one process count.
    shape = require_uniform_nodes(x, "Lightning")
    require_even(x, "Lightning", "gives every process the same DataLoader batch size")
    require_data_parallel(x, "Lightning's ddp strategy")
    p = x.plan
    lr, o = recipe(x)
    trainer: dict[str, Any] = {
        "accelerator": "gpu",
        "devices": shape,
        "num_nodes": num_nodes(x),
        "strategy": "ddp",
        "accumulate_grad_batches": p.gradient_accumulation_steps,
        "use_distributed_sampler": False,
        "gradient_clip_val": o.max_grad_norm,
    }
    if o.max_grad_norm is not None:
        trainer["gradient_clip_algorithm"] = "norm"
    notes = {
        "use_distributed_sampler": "plan_train_dataloader: the plan's sampler, seed, shuffle, drop_last",
        "gradient_clip_val": "no clipping"
        if o.max_grad_norm is None
        else "of the all-reduced gradient, one global norm",
    }
    epochs = p.sampler.epochs if p.sampler else None
    full_run = epochs * p.sampler.optimizer_steps_per_epoch if epochs and p.sampler else None
    trainer["max_epochs"] = epochs if epochs is not None else (-1 if lr.train_steps else 1)
    if lr.train_steps is not None and lr.train_steps != full_run:
        trainer["max_steps"] = lr.train_steps
    if leftover_micro_batches(x) and p.sampler is not None:
        # Lightning steps on the last batch of an epoch even mid-accumulation; stopping the
        # epoch at the plan's last whole step drops the leftovers, as the plan does.
        trainer["limit_train_batches"] = p.sampler.optimizer_steps_per_epoch * p.gradient_accumulation_steps
        notes["limit_train_batches"] = (
            f"{p.sampler.optimizer_steps_per_epoch} optimizer steps per epoch, as planned; the "
            f"{leftover_micro_batches(x)} micro-batches after them are dropped"
        )
    hooks = _HOOKS
    for token, value in {
        "__NOTE__": optimizer_note(x) or f"torch.optim.{o.torch_class}, every parameter in one group",
        "__OPTIMIZER__": optimizer_call(x, "module.parameters()"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
        "__SHUFFLE__": py_literal(p.sampler.shuffle if p.sampler else True),
        "__SEED__": py_literal(p.sampler.seed if p.sampler else 0),
        "__DROP_LAST__": py_literal(p.sampler.drop_last if p.sampler else False),
        "__MICRO__": str(p.micro_batch_size),
    }.items():
        hooks = hooks.replace(token, value)
    lines = [
        comment(summary(x) + resume_notes(x, "lightning")),
        "# Lightning divides the loss by accumulate_grad_batches and steps the optimizer once per",
        "# accumulation; the hooks below give it the plan's optimizer, lr schedule and sampler.",
        "import math",
        "",
        "import lightning as L",
        "import torch",
        "from torch.utils.data import DataLoader, DistributedSampler",
        "",
        python_call("trainer = L.Trainer", trainer, notes),
        "",
        "",
        lr_block(x),
        hooks,
    ]
    return Export("lightning", "text/plain", "lightning_trainer.py", "\n".join(lines))
