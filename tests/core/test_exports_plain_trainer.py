"""A plain `Trainer(args=training_args)`: the hf-trainer export's TrainingArguments alone, as many
users copy them into their own script, trained by transformers' own Trainer (CPU, one process)
for the plan's whole run. It trains the plan's optimizer and the plan's lr at every step, or the
export's header says exactly what it gets wrong: each difference seen is a sentence of the
header's list, and the run corrected by the list's sentences is the plan's.

- The optimizer: the plain Trainer's (its class and param groups, as it built them) and the
  plan's (PlanTrainer.create_optimizer, which test_exports_trainers holds to the plan) take the
  same three steps on the same parameters and gradients; where they differ, the sentences about
  weight decay on biases and norms and about Adam's decoupled decay, applied to the plain one's
  groups and class, must make them equal.
- The lr: recorded at every optimizer step of the real run; where it differs from the plan's,
  the sentence about the warmup's start or the missing step decay names the schedule it runs
  instead, which must be it at every step.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from export_helpers import call_kwargs, export_input
from support.parallel import IN_PROCESS_TRAINERS

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.learning_rate.recipe_summary import lr_of

pytestmark = [
    pytest.mark.slow,  # transformers takes seconds to import; each run about 1 s
    IN_PROCESS_TRAINERS,
    # warmup_stable_decay with num_stable_steps 0, as the export means it (hf_trainer_args.py)
    pytest.mark.filterwarnings("ignore:Both num_training_steps and num_stable_steps"),
]

STEPS = 12  # 48 samples, global batch 4 (micro-batch 2 x accumulation 2): 12 steps, none left over


def _body(**lr: Any) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": 1},
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "dataset": {"num_samples": 48, "epochs": 1},
        "learning_rate": {"base_lr": 0.1, "base_batch_size": 4, "rule": "linear", **lr},
    }


RECIPES = {
    "sgd-constant": _body(),
    "sgd-nesterov-warmup-cosine-decayed": _body(
        momentum=0.8, nesterov=True, warmup_steps=3, warmup_start_lr=0.02, decay="cosine", min_lr=0.005,
        weight_decay=0.01,
    ),
    "sgd-cosine-no-warmup": _body(decay="cosine", min_lr=0.01),
    "adamw-sqrt-warmup-linear-to-its-start": _body(
        optimizer="adamw", rule="sqrt", base_batch_size=16, warmup_steps=2, warmup_start_lr=0.0,
        decay="linear", weight_decay=0.1,
    ),
    "adam-linear-floor-not-start": _body(
        optimizer="adam", warmup_steps=4, warmup_start_lr=0.0, decay="linear", min_lr=0.01
    ),
    "adam-decayed-constant-warmup": _body(
        optimizer="adam", warmup_steps=5, warmup_start_lr=0.0, weight_decay=0.01
    ),
    "sgd-step-after-warmup": _body(warmup_steps=2, warmup_start_lr=0.0, decay="step", milestones=[6, 9]),
    "lars-step-no-warmup": _body(optimizer="lars", decay="step", milestones=[4], gamma=0.5),
}  # fmt: skip


def _claims(text: str) -> list[str]:
    """The header's list of what a plain Trainer gets wrong: its '# - ' lines."""
    claims: list[str] = []
    for line in text[: text.index("\nimport ")].splitlines():
        if line.startswith("# - "):
            claims.append(line.removeprefix("# - "))
        elif line.startswith("#   ") and claims:
            claims[-1] += " " + line.removeprefix("#   ")
    return claims


class Tiny:
    """A model the Trainer trains: Linear, LayerNorm, Linear, a mean-squared loss."""

    @staticmethod
    def build() -> Any:
        import torch

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inp = torch.nn.Linear(3, 4)
                self.norm = torch.nn.LayerNorm(4)
                self.out = torch.nn.Linear(4, 1)

            def forward(self, x: Any, labels: Any) -> dict[str, Any]:
                loss = torch.nn.functional.mse_loss(self.out(self.norm(self.inp(x))), labels)
                return {"loss": loss}

        torch.manual_seed(0)
        return Model()


def _plain_run(x: ExportInput, tmp_path: Path) -> tuple[Any, list[float], Any]:
    """(the plain Trainer after its run, the lr of every optimizer step, the export's namespace)."""
    import torch
    import transformers

    text = export("hf-trainer", x).text
    values = call_kwargs(text, "TrainingArguments")
    args = transformers.TrainingArguments(
        **{**values, "output_dir": str(tmp_path), "use_cpu": True, "report_to": "none", "save_strategy": "no"}
    )
    lrs: list[float] = []

    class Record(transformers.TrainerCallback):
        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            lrs.append(float(kwargs["optimizer"].param_groups[0]["lr"]))

    g = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(3, generator=g), "labels": torch.randn(1, generator=g)} for _ in range(48)]
    trainer = transformers.Trainer(model=Tiny.build(), args=args, train_dataset=data, callbacks=[Record()])
    trainer.train()
    namespace: dict[str, Any] = {}
    exec(text, namespace)
    return trainer, lrs, namespace


def _three_steps(optimizer_of: Any, model: Any) -> list[Any]:
    """The parameters after three steps of `optimizer_of(model)` on fixed gradients."""
    import torch

    model = copy.deepcopy(model)
    optimizer = optimizer_of(model)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _rebuilt(optimizer: Any, model: Any, cls: Any = None, weight_decay: float | None = None) -> Any:
    """`optimizer`'s class (or `cls`) and groups, with their hyperparameters (weight decay
    `weight_decay` in every group if given), on `model`'s parameters at the peak lr."""
    index = {id(p): name for name, p in model.named_parameters()}
    params = dict(model.named_parameters())
    # Another class takes its own way of applying weight decay (Adam's: to the gradient).
    keep = set((cls or type(optimizer))([params[next(iter(params))]]).defaults) - {"params"}
    keep -= {"decoupled_weight_decay"} if cls else set()
    cls = cls or type(optimizer)

    def build(target: Any) -> Any:
        named = dict(target.named_parameters())
        groups = []
        for group in optimizer.param_groups:
            hyper = {k: v for k, v in group.items() if k in keep and k not in ("lr", "initial_lr")}
            if weight_decay is not None:
                hyper["weight_decay"] = weight_decay
            groups.append({"params": [named[index[id(p)]] for p in group["params"]], **hyper})
        return cls(groups, lr=optimizer.defaults["lr"])

    return build


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_plain_trainer_trains_the_plans_recipe_or_the_header_says_what_it_gets_wrong(
    name: str, tmp_path: Path
) -> None:
    import torch

    x = export_input(RECIPES[name])
    lr = x.plan.learning_rate
    assert lr is not None and lr.train_steps == STEPS
    trainer, lrs, namespace = _plain_run(x, tmp_path)
    claims = _claims(export("hf-trainer", x).text)
    said = " | ".join(claims)

    # The optimizer: the plain one against the plan's, three steps on the same gradients.
    model = trainer.model
    plan_trainer = namespace["PlanTrainer"](model=model, args=trainer.args)
    planned = plan_trainer.create_optimizer()
    for group in planned.param_groups:
        group["lr"] = lr.lr
    want = _three_steps(_rebuilt(planned, model), model)
    plain = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # inside Accelerate's wrapper
    got = _three_steps(_rebuilt(plain, model), model)
    same = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    biases = any("does not decay biases and norm weights" in c for c in claims)
    decoupled = any("decouples the weight decay" in c for c in claims)
    assert same == (not biases and not decoupled), (name, same, said)
    if not same:
        fixed = _rebuilt(
            plain,
            model,
            cls=torch.optim.Adam if decoupled else None,
            weight_decay=lr.weight_decay if biases else None,
        )
        corrected = _three_steps(fixed, model)
        assert all(torch.equal(a, b) for a, b in zip(corrected, want, strict=True)), (name, said)

    # The lr at every optimizer step of the run.
    assert len(lrs) == STEPS
    plan_lrs = [lr_of(lr, k) for k in range(STEPS)]
    starts = [re.search(r"warms up from (\S+), not", c) for c in claims]
    start = next((float(m[1]) for m in starts if m), None)
    no_step = any("no step decay" in c for c in claims)
    matches = lrs == pytest.approx(plan_lrs, rel=1e-12, abs=1e-15)
    assert matches == (start is None and not no_step), (name, lrs, plan_lrs, said)
    if not matches:
        runs = dataclasses.replace(
            lr,
            warmup_start_lr=lr.warmup_start_lr if start is None else start,
            decay="constant" if no_step else lr.decay,
        )
        assert lrs == pytest.approx([lr_of(runs, k) for k in range(STEPS)], rel=1e-12, abs=1e-15), (
            name,
            said,
        )
