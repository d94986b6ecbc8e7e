"""The torchrun program of tests/core/test_recipe_runs.py: trains the toy (support/recipe_toys.py)
for each case in turn, with the case's tool as its export says, and writes what happened.

    torchrun --nproc-per-node N recipe_runner.py CASES.json OUT_DIR

Each case names its tool, an export file, the toy's sample count and this rank's loss weight.
The export is used as a person would: the python skeleton with build_model, build_dataset and
loss_fn replaced; the HF Trainer export's training_args and PlanTrainer; the accelerate export's
train() cut out of its header; the lightning export's Trainer (on CPU) and its two hooks. The
cases of several tools may share one torchrun (its start-up is most of a run's cost): each
tool finds the process group the first one made, as a second run of the same tool does.
Rank 0 saves, per case, each optimizer step's lr and loss (over the global batch, as the plan
weighs it) and the final parameters, to OUT_DIR/<case>.pt.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from support.recipe_toys import DictDataset, HfModel, PairDataset, Recorder, build_model


def _python(case: dict[str, Any], net: nn.Module, recorder: Recorder) -> None:
    spec = importlib.util.spec_from_file_location(f"skeleton_{case['name']}", case["export"])
    assert spec is not None and spec.loader is not None
    skeleton = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(skeleton)
    # What the skeleton's docstring asks of a user: their model, their data, their loss.
    skeleton.build_model = lambda: net
    skeleton.build_dataset = lambda: PairDataset(case["num_samples"])
    skeleton.loss_fn = recorder.loss
    sys.argv = [case["export"], "--log-every", "1000000"]
    # One process group for all the cases of this torchrun: a group destroyed and made again
    # under torchrun's store hangs. The skeleton's own calls keep the first one.
    init = dist.init_process_group
    with (
        mock.patch.object(
            dist, "init_process_group", lambda *a, **k: None if dist.is_initialized() else init(*a, **k)
        ),
        mock.patch.object(dist, "destroy_process_group", lambda *a, **k: None),
    ):
        skeleton.main()


def _hf_trainer(case: dict[str, Any], net: nn.Module, recorder: Recorder) -> None:
    namespace: dict[str, Any] = {"__name__": "training_args"}
    exec(compile(Path(case["export"]).read_text(), case["export"], "exec"), namespace)
    args = namespace["training_args"]
    args.output_dir = str(Path(case["export"]).parent / f"hf_{case['name']}")
    args.disable_tqdm = True
    trainer = namespace["PlanTrainer"](
        model=HfModel(net, recorder), args=args, train_dataset=DictDataset(case["num_samples"])
    )
    trainer.train()


def _accelerate(case: dict[str, Any], net: nn.Module, recorder: Recorder) -> None:
    lines = Path(case["export"]).read_text().splitlines()
    start = lines.index("# ---- training script ----") + 1
    end = lines.index("# ---- end of training script ----")
    source = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines[start:end])
    namespace: dict[str, Any] = {"__name__": "train_script"}
    exec(compile(source, case["export"], "exec"), namespace)
    namespace["train"](net, PairDataset(case["num_samples"]), recorder.loss)


def _lightning(case: dict[str, Any], net: nn.Module, recorder: Recorder) -> None:
    import lightning as L  # noqa: N812  (Lightning's own spelling)

    def cpu_trainer(**kwargs: Any) -> L.Trainer:
        # The export's Trainer as it runs on CPU here, without logs, checkpoints or bars.
        quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
        return L.Trainer(**{**kwargs, "accelerator": "cpu"}, **quiet, enable_model_summary=False)

    text = Path(case["export"]).read_text().replace("trainer = L.Trainer(", "trainer = cpu_trainer(")
    namespace: dict[str, Any] = {"__name__": "lightning_trainer", "cpu_trainer": cpu_trainer}
    exec(compile(text, case["export"], "exec"), namespace)
    dataset = PairDataset(case["num_samples"])

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            x, y = batch
            return recorder.loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return namespace["plan_optimizers"](self)

        def train_dataloader(self) -> Any:
            return namespace["plan_train_dataloader"](dataset, self.trainer)

    namespace["trainer"].fit(Module())


TOOLS = {"python": _python, "hf-trainer": _hf_trainer, "accelerate": _accelerate, "lightning": _lightning}


def run_case(case: dict[str, Any], out: Path) -> None:
    net = build_model()
    steps: list[dict[str, float]] = []

    def after_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        # Accelerate's wrapper steps the torch optimizer inside: count the torch one only.
        if not type(optimizer).__module__.startswith("torch.optim"):
            return
        loss = torch.tensor([recorder.pending], dtype=torch.float64)
        recorder.pending = 0.0
        dist.all_reduce(loss)
        steps.append({"lr": float(optimizer.param_groups[0]["lr"]), "loss": loss.item()})

    rank = int(__import__("os").environ["RANK"])
    recorder = Recorder(case["weights"][rank])
    handle = register_optimizer_step_post_hook(after_step)
    try:
        TOOLS[case["tool"]](case, net, recorder)
    finally:
        handle.remove()
    if rank == 0:
        params = {k: v.detach().clone() for k, v in net.named_parameters()}
        torch.save({"steps": steps, "params": params}, out / f"{case['name']}.pt")
        print(f"{case['tool']} {case['name']}: {len(steps)} optimizer steps", flush=True)


def main() -> None:
    cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    torch.set_num_threads(1)
    for case in cases:
        run_case(case, out)
    # Free DDP's hold on the group while Python is alive, then leave together (the skeleton
    # destroys its own group at the end of each run).
    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
