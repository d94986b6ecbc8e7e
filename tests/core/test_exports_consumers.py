"""Each export loaded by the real tool that reads it (the `consumers` dependency group), and
the tool's own numbers compared with the plan's: world / data-parallel size, micro-batch,
accumulation, learning rate and warmup (the trainers': test_exports_trainers.py). A test skips
where its tool is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from consumer_bodies import EVEN, MODEL_PARALLEL, UNEVEN, refuses_model_parallel
from export_helpers import export_input

from app.core.exports.parts.export_types import ExportUnsupported
from app.core.exports.registry import export
from app.core.learning_rate.recipe_summary import lr_of
from app.ports import free_port

pytestmark = pytest.mark.slow  # each tool takes seconds to import


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
    refuses_model_parallel("accelerate")


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
