"""Each export loaded by the real tool that reads it (the `consumers` dependency group), and
the tool's own numbers compared with the plan's: world / data-parallel size, micro-batch,
accumulation, learning rate and warmup. A test skips where its tool is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from export_helpers import call_kwargs, export_input

from app.core.exports import ExportInput, ExportUnsupported, export
from app.core.recipe import lr_of
from app.ports import free_port
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES

pytestmark = pytest.mark.slow  # each tool takes seconds to import

IMAGENET = EXAMPLES["dataset_and_lr"]["value"]  # the README's first plan
ADAM = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "global_batch_size": 1024,
    "dataset": {"num_samples": 100000, "epochs": 3},
    "learning_rate": {"base_lr": 0.0003, "base_batch_size": 256, "optimizer": "adam", "rule": "sqrt"},
}
# The README's model-parallel plan, and the issue's: tensor 2 on 16 GPUs.
README_MODEL_PARALLEL = {
    "topology": {"num_nodes": 4, "gpus_per_node": 8},
    "parallelism": {"tensor": 4, "pipeline": 2, "context": 1},
    "global_batch_size": 256,
    "max_micro_batch_size": 16,
}
TENSOR_2 = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "parallelism": {"tensor": 2},
    "global_batch_size": 256,
    "learning_rate": {"base_lr": 0.1, "warmup_steps": 10},
}
EVEN = {"imagenet": IMAGENET, "homogeneous": EXAMPLES["homogeneous"]["value"], "adam": ADAM}
MODEL_PARALLEL = {"readme": README_MODEL_PARALLEL, "tensor2": TENSOR_2}
UNEVEN = EXAMPLES["mixed"]["value"]  # the README's mixed cluster


def _refuses_model_parallel(fmt: str) -> None:
    for body in MODEL_PARALLEL.values():
        x = export_input(body)
        with pytest.raises(ExportUnsupported, match="data-parallel only") as caught:
            export(fmt, x)
        assert caught.value.pointer == "/parallelism"
        assert f"not {x.plan.global_batch_size}" in caught.value.detail


# ----------------------------------------------------------------------------- DeepSpeed


def _deepspeed_numbers(cases: list[tuple[dict[str, Any], int]]) -> list[dict[str, Any]]:
    pytest.importorskip("deepspeed")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("deepspeed_probe.py"))],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"},
        check=True,
    ).stdout
    [line] = [line for line in out.splitlines() if line.startswith("RESULT ")]
    return list(json.loads(line.removeprefix("RESULT ")))


def test_deepspeed_config_gives_deepspeed_the_plans_numbers() -> None:
    inputs = {name: export_input(body) for name, body in {**EVEN, **MODEL_PARALLEL}.items()}
    configs = {name: json.loads(export("deepspeed", x).text) for name, x in inputs.items()}
    cases = [(configs[name], x.plan.data_parallel_size) for name, x in inputs.items()]
    # A model-parallel plan without its unit: DeepSpeed divides by every GPU, and refuses.
    cases += [(configs[name], inputs[name].plan.world_size) for name in MODEL_PARALLEL]
    results = _deepspeed_numbers(cases)
    for (name, x), got in zip(inputs.items(), results, strict=False):
        p = x.plan
        assert (got["world_size"], got["train_batch_size"], got["micro"], got["accumulation"]) == (
            p.data_parallel_size,
            p.global_batch_size,
            p.micro_batch_size,
            p.gradient_accumulation_steps,
        ), name
        lr = p.learning_rate
        if lr is None:
            assert got["optimizer"] is None and got["scheduler"] is None
            continue
        params = got["optimizer_params"]
        assert params["lr"] == lr_of(lr, 0)  # step 0's: DeepSpeed steps its scheduler after a step
        if lr.optimizer == "sgd":
            assert params["momentum"] == 0.9
        else:
            assert lr.adam is not None and lr.adam.valid
            assert params["betas"] == [lr.adam.beta1, lr.adam.beta2] and params["eps"] == lr.adam.eps
        if lr.warmup_steps:
            # The plan's lr at every step: from its start lr up to its lr, then constant.
            planned = [lr_of(lr, k) for k in range(len(got["lrs"]))]
            assert got["lrs"] == pytest.approx(planned, rel=1e-12)
    for name, got in zip(MODEL_PARALLEL, results[len(inputs) :], strict=True):
        assert "refused" in got, name
        assert "deepspeed.initialize(mpu=...)" in configs[name]["batchplan_note"]
    for name in EVEN:
        assert "batchplan_note" not in configs[name]


# ----------------------------------------------------------------------------- Accelerate


@pytest.mark.parametrize("name", sorted(EVEN))
def test_accelerate_loads_the_config_and_launches_with_the_plans_world(name: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    x = export_input(EVEN[name])
    text = export("accelerate", x).text
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(text)
    config = load_config_from_file(str(path))
    assert config.num_processes == x.plan.data_parallel_size == x.plan.world_size
    assert config.num_machines == 2 and config.main_process_port == 29500
    assert config.main_process_ip is None  # never the literal "MASTER_ADDR"
    # The header's launch line, as a node would run it, resolved by `accelerate launch` itself.
    [launch] = [line.removeprefix("# Launch: ") for line in text.splitlines() if line.startswith("# Launch:")]
    argv = launch.replace("$NODE_RANK", "1").replace('"$MASTER_ADDR"', "10.0.0.7").split()[2:]
    argv[argv.index("accelerate_config.yaml")] = str(path)
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert (args.num_processes, args.num_machines, args.machine_rank) == (16, 2, 1)
    assert args.main_process_ip == "10.0.0.7" and args.multi_gpu
    assert f"Accelerator(gradient_accumulation_steps={x.plan.gradient_accumulation_steps})" in text
    assert f"batch_size={x.plan.micro_batch_size}," in text
    lr = x.plan.learning_rate
    if lr is not None and lr.adam is not None:
        assert f"betas ({lr.adam.beta1!r}, {lr.adam.beta2!r}), eps {lr.adam.eps!r}" in text


def test_accelerate_refuses_model_parallel_plans() -> None:
    _refuses_model_parallel("accelerate")


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
    _refuses_model_parallel("hf-trainer")


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
    _refuses_model_parallel("lightning")


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


# ----------------------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("name", sorted(EVEN))
def test_pytorchjob_loads_in_the_kubeflow_sdk_and_its_pods_validate(name: str) -> None:
    pytest.importorskip("kubeflow.training")
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubeflow.training.api_client import ApiClient

    x = export_input(EVEN[name])
    manifest = yaml.safe_load(export("kubernetes", x).text)
    # The SDK's own model: it refuses a spec without runPolicy.
    job = ApiClient()._ApiClient__deserialize(manifest, "KubeflowOrgV1PyTorchJob")  # type: ignore[attr-defined]
    specs = job.spec.pytorch_replica_specs
    assert job.spec.run_policy is not None
    pods = specs["Master"].replicas + specs["Worker"].replicas
    assert pods * int(job.spec.nproc_per_node) == x.plan.data_parallel_size
    for role, spec in specs.items():
        template = manifest["spec"]["pytorchReplicaSpecs"][role]["template"]
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": template,
        }
        kubernetes_validate.validate(pod_template, kubernetes_validate.latest_version(), strict=True)
        [container] = spec.template.spec.containers
        assert "--master-port" not in container.command  # the operator sets the port itself
        assert [m.mount_path for m in container.volume_mounts] == ["/dev/shm"]
        assert spec.template.spec.volumes[0].empty_dir.medium == "Memory"
        env = {e.name: e.value for e in container.env}
        assert int(env["MICRO_BATCH_SIZE"]) == x.plan.micro_batch_size
        assert int(env["GRADIENT_ACCUMULATION_STEPS"]) == x.plan.gradient_accumulation_steps


# ----------------------------------------------------------------------------- uneven plans


@pytest.mark.parametrize("fmt", ["deepspeed", "accelerate", "hf-trainer", "lightning", "kubernetes"])
def test_formats_with_one_batch_size_refuse_the_readmes_uneven_plan(fmt: str) -> None:
    x = export_input(UNEVEN)
    assert x.plan.micro_batch_size is None
    with pytest.raises(ExportUnsupported):
        export(fmt, x)
