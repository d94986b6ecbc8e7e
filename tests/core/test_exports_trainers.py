"""The trainer exports loaded by the real tools (the `consumers` dependency group): Transformers'
TrainingArguments and Lightning's Trainer get the plan's world, micro-batch, accumulation,
learning rate and steps per epoch. A test skips where its tool is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from consumer_bodies import EVEN, refuses_model_parallel
from export_helpers import call_kwargs, export_input
from support.parallel import IN_PROCESS_TRAINERS

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.learning_rate.recipe_summary import lr_of

pytestmark = [pytest.mark.slow, IN_PROCESS_TRAINERS]  # each tool takes seconds to import


# ----------------------------------------------------------------------------- HF Trainer


def _training_arguments(x: ExportInput, tmp_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    values = call_kwargs(export("hf-trainer", x).text, "TrainingArguments")
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (args,) = parser.parse_dict({**values, "output_dir": str(tmp_path), "use_cpu": True})
    return args


@pytest.mark.parametrize("name", sorted(EVEN))
def test_hf_trainer_arguments_give_the_trainer_the_plans_numbers(name: str, tmp_path: Path) -> None:
    x = export_input(EVEN[name])
    args = _training_arguments(x, tmp_path)
    import torch

    p = x.plan
    # The Trainer's global batch: per device x accumulation x the processes torchrun starts.
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * p.world_size == (
        p.global_batch_size
    )
    assert args.per_device_train_batch_size == p.micro_batch_size
    lr = p.learning_rate
    if lr is None:
        return
    assert args.max_grad_norm == 0.0  # no clipping: the Trainer's own default is 1.0
    # The export's PlanTrainer builds the optimizer and the schedule the Trainer steps.
    namespace: dict[str, Any] = {}
    exec(export("hf-trainer", x).text, namespace)
    trainer = namespace["PlanTrainer"](model=torch.nn.Linear(2, 1, dtype=torch.float64), args=args)
    optimizer = trainer.create_optimizer()
    assert optimizer.param_groups[0]["lr"] == lr.lr and len(optimizer.param_groups) == 1
    if lr.optimizer == "sgd":
        assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0.9
    else:
        assert lr.adam is not None
        assert type(optimizer) is torch.optim.Adam  # the plan's adam: no AdamW stand-in
        assert optimizer.defaults["betas"] == (lr.adam.beta1, lr.adam.beta2)
        assert optimizer.defaults["eps"] == lr.adam.eps
    total = 10 * lr.warmup_steps + 10
    scheduler = trainer.create_scheduler(total, optimizer)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # The plan's warmup (from its start lr, not the Trainer's 0), then its decay.
    assert lrs == pytest.approx([lr_of(lr, k) for k in range(total)], rel=1e-12)


def test_hf_trainer_refuses_model_parallel_plans() -> None:
    refuses_model_parallel("hf-trainer")


# ----------------------------------------------------------------------------- Lightning


@pytest.mark.parametrize("name", sorted(EVEN))
def test_lightning_trainer_takes_the_plans_world_and_accumulation(name: str) -> None:
    L = pytest.importorskip("lightning")
    x = export_input(EVEN[name])
    kwargs = call_kwargs(export("lightning", x).text, "Trainer")
    # Built on CPU, with the exported devices, nodes and strategy: the world the GPUs would form.
    trainer = L.Trainer(**{**kwargs, "accelerator": "cpu"}, logger=False, enable_checkpointing=False)
    p = x.plan
    assert trainer.world_size == p.data_parallel_size
    assert trainer.accumulate_grad_batches == p.gradient_accumulation_steps
    assert call_kwargs(export("lightning", x).text, "DataLoader")["batch_size"] == p.micro_batch_size
    if p.sampler is not None and p.sampler.epochs is not None:
        assert trainer.max_epochs == p.sampler.epochs


def test_lightning_refuses_model_parallel_plans() -> None:
    refuses_model_parallel("lightning")


# A plan whose epoch ends mid-accumulation: 15 micro-batches of 2, accumulation 4, so the
# plan counts 3 optimizer steps per epoch and 3 micro-batches are left over.
LEFTOVER = {
    "topology": {"num_nodes": 1, "gpus_per_node": 1},
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "dataset": {"num_samples": 30, "epochs": 2, "shuffle": False},
    "learning_rate": {"base_lr": 0.1, "base_batch_size": 8},
}


def test_lightning_steps_per_epoch_are_the_plans() -> None:
    L = pytest.importorskip("lightning")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = export_input(LEFTOVER)
    assert x.plan.sampler is not None
    assert (x.plan.sampler.micro_steps_per_epoch, x.plan.sampler.optimizer_steps_per_epoch) == (15, 3)
    text = export("lightning", x).text
    kwargs = call_kwargs(text, "Trainer")

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(
        **{**kwargs, "accelerator": "cpu", "strategy": "auto"},
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.arange(30.0).reshape(30, 1)
    loader = DataLoader(TensorDataset(data, data), **call_kwargs(text, "DataLoader"))
    trainer.fit(Model(), loader)
    assert trainer.global_step == 3 * 2  # the plan's 3 steps per epoch, not Lightning's own 4
