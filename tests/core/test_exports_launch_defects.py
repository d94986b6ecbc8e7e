"""The launch exports' defects seen on a real Slurm, each checked with bash (and a stand-in
scontrol or torchrun that records what it was given) so that it shows without a cluster;
tests/slurm runs the same scripts under a real Slurm."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from export_helpers import export_input

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.parts.preflight import check_request, plan_json
from app.core.exports.registry import export
from app.core.request.parse import plan_request
from app.ports import free_port
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES

EVEN = {"topology": {"num_nodes": 2, "gpus_per_node": 4}, "global_batch_size": 64}
MIXED = EXAMPLES["mixed"]["value"]


def with_options(body: dict[str, Any], **options: Any) -> ExportInput:
    x = export_input(body)
    return replace(x, options=replace(x.options, **options))


def fake(tmp_path: Path, name: str, script: str) -> dict[str, str]:
    """An environment whose PATH finds `name` (a bash script) in tmp_path first."""
    tool = tmp_path / name
    tool.write_text("#!/bin/bash\n" + script)
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def master_lines(text: str) -> str:
    """The lines of an sbatch script from `set -euo pipefail` to the MASTER_* export."""
    lines = text.splitlines()
    first = lines.index("set -euo pipefail")
    last = lines.index("export MASTER_ADDR MASTER_PORT")
    return "\n".join([lines[first], *(line for line in lines[first : last + 1] if "MASTER" in line)])


@pytest.mark.parametrize("body", [EVEN, MIXED], ids=["even", "heterogeneous"])
def test_cpus_per_task_is_asked_for_and_passed_to_srun(body: dict[str, Any]) -> None:
    x = with_options(body, cpus_per_gpu=3)
    text = export("slurm", x).text
    asked = [
        int(line.split("=")[1]) for line in text.splitlines() if line.startswith("#SBATCH --cpus-per-task=")
    ]
    assert asked == [3 * g.gpus_per_node for g in x.request.topology.node_groups][: len(asked)]
    assert len(asked) == (1 if body is EVEN else len(x.request.topology.node_groups))
    # srun 22.05 does not take --cpus-per-task from sbatch: each component passes its own.
    step = text[text.index("\nsrun ") :]
    passed = [int(w.split("=")[1]) for w in shlex.split(step) if w.startswith("--cpus-per-task=")]
    assert passed == asked


def test_the_rendezvous_port_follows_the_job_id(tmp_path: Path) -> None:
    env = fake(tmp_path, "scontrol", "echo node1; echo node2\n")
    script = master_lines(export("slurm", export_input(EVEN)).text) + '\necho "$MASTER_PORT"'
    ports = {
        job: int(
            subprocess.run(
                ["bash", "-c", script],
                env={**env, "SLURM_JOB_ID": str(job), "SLURM_JOB_NODELIST": "node[1-2]"},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for job in (41, 42)
    }
    assert ports[41] != ports[42]  # two jobs on one node: two rendezvous
    assert all(1024 <= p <= 65535 for p in ports.values())


@pytest.mark.parametrize("body", [EVEN, MIXED], ids=["even", "heterogeneous"])
def test_the_first_host_of_a_long_node_list_survives_pipefail(body: dict[str, Any], tmp_path: Path) -> None:
    # 200000 names: far more than a pipe holds, so a reader that stops early kills scontrol.
    env = fake(tmp_path, "scontrol", 'for ((i = 0; i < 200000; i++)); do echo "node$i"; done\n')
    script = master_lines(export("slurm", export_input(body)).text) + '\necho "$MASTER_ADDR"'
    done = subprocess.run(
        ["bash", "-c", script],
        env={**env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "x", "SLURM_JOB_NODELIST_HET_GROUP_0": "x"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "node0\n"), done.stderr


def test_job_wide_options_come_before_the_first_hetjob() -> None:
    lines = export("slurm", export_input(MIXED)).text.splitlines()
    first_component_ends = lines.index("#SBATCH hetjob")
    for option in ("--job-name", "--output"):
        [at] = [i for i, line in enumerate(lines) if line.startswith(f"#SBATCH {option}=")]
        assert at < first_component_ends


def test_the_setup_line_runs_before_anything_needs_the_environment() -> None:
    x = with_options(EVEN, setup="source /shared/venv/bin/activate", preflight=True)
    for fmt in ("slurm", "torchrun"):
        lines = export(fmt, x).text.splitlines()
        setup = lines.index("source /shared/venv/bin/activate")
        assert setup < min(
            i for i, line in enumerate(lines) if "torchrun" in line and not line.startswith("#")
        )
    without = export("slurm", export_input(EVEN)).text
    assert "#   source /path/to/venv/bin/activate" in without  # where it goes, as a comment


@pytest.mark.parametrize("body", [EVEN, MIXED, *(e["value"] for e in EXAMPLES.values())])
def test_the_preflight_request_is_the_plan_request(body: dict[str, Any]) -> None:
    """All of it but what the gradient check does not use: the lr and a measured noise scale."""
    x = export_input(body)
    checked = replace(
        x.request, learning_rate=None, gradient_noise_scale=None, gradient_noise_scale_stderr=None
    )
    assert plan_request(json.loads(json.dumps(plan_json(x.request)))) == checked


@pytest.mark.parametrize("name", ["measured_lr", "mixed_curves", "dataset_and_lr"])
def test_a_preflight_run_carries_the_whole_request_curves_and_measured_rule_included(name: str) -> None:
    """A run (preflight_steps above 1) trains the recipe: the rank program reads back the very
    request, a throughput curve and an lr-scaling probe's numbers included."""
    x = with_options(EXAMPLES[name]["value"], preflight_steps=3)
    sent = json.loads(check_request(x))["plan"]
    assert plan_request(sent) == replace(
        x.request, gradient_noise_scale=None, gradient_noise_scale_stderr=None
    )


def test_torchrun_preflight_runs_the_check_on_the_same_launcher_line_and_stops_on_failure(
    tmp_path: Path,
) -> None:
    """A stand-in torchrun records its arguments and, for the check, prints a failed result."""
    log = tmp_path / "calls"
    finding = {"cause": "batch_norm", "detail": "d", "fix": "f", "breaks_equivalence": True}
    failed = {
        "passed": False, "processes": 4, "nnodes": 1, "micro_batch_sizes": [16],
        "gradient_accumulation_steps": 1, "global_batch_size": 64, "rel_l2": 0.5, "tolerance": 1e-9,
        "controls": [],
        "ddp_equivalence": {"equivalent": False, "summary": "not DDP-equivalent", "findings": [finding]},
    }  # fmt: skip
    env = fake(
        tmp_path,
        "torchrun",
        f'printf "%s\\n" "$*" >> {log}\nif [ "$6" = -m ]; then echo {shlex.quote(json.dumps(failed))}; fi\n',
    )
    env["PATH"] = env["PATH"].replace(f"{tmp_path}:", f"{tmp_path}:{Path(sys.executable).parent}:", 1)
    text = export(
        "torchrun", with_options({**EVEN, "topology": {"num_nodes": 1, "gpus_per_node": 4}}, preflight=True)
    ).text
    done = subprocess.run(
        ["bash", "-c", text], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "batchplan preflight FAILED, training not started" in done.stderr and "batch_norm" in done.stderr
    [check] = log.read_text().splitlines()  # the training never started
    assert check.startswith("--nnodes 1 --nproc-per-node 4 --standalone -m app.worker.gradcheck --request {")


def test_kubernetes_preflight_runs_before_training_and_fails_the_job_for_good() -> None:
    x = with_options(EVEN, preflight=True, model_factory="app.worker.example_models:mlp")
    manifest = yaml.safe_load(export("kubernetes", x).text.split("\n", 3)[3])
    for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
        assert spec["restartPolicy"] == "ExitCode"
        [container] = spec["template"]["spec"]["containers"]
        shell, flag, script = container["command"]
        assert (shell, flag) == ("bash", "-c")
        subprocess.run(["bash", "-n", "-c", script], check=True)
        check = script.index("torchrun --nnodes 2 --nproc-per-node 4 -m app.worker.gradcheck")
        assert check < script.index("exec torchrun --nnodes 2 --nproc-per-node 4 train.py")
        assert "--model-factory app.worker.example_models:mlp" in script


def test_scripts_that_run_on_every_node_ask_every_node_to_print_the_verdict() -> None:
    """torchrun and PyTorchJob scripts judge from each node's own output; sbatch's one script
    reads what srun gathers from all nodes, where one verdict is enough."""
    for fmt, every_node in (("torchrun", True), ("kubernetes", True), ("slurm", False)):
        text = export(fmt, with_options(EVEN, preflight=True)).text
        assert ("--result-on-every-node" in text) is every_node, fmt
    one_node = {**EVEN, "topology": {"num_nodes": 1, "gpus_per_node": 4}}
    assert "--result-on-every-node" not in export("torchrun", with_options(one_node, preflight=True)).text


@pytest.mark.slow
def test_the_skeleton_refuses_batch_sizes_of_another_plan(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(export("python", export_input({"topology": {"num_nodes": 1, "gpus_per_node": 1},
                                                     "global_batch_size": 8})).text)  # fmt: skip
    env = {**os.environ, "BATCHPLAN_TOY": "1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    env["GLOBAL_BATCH_SIZE"] = "16"  # the plan has 8
    done = subprocess.run(
        [sys.executable, str(script), "--max-steps", "1"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "the launch script sets GLOBAL_BATCH_SIZE=16, this script's plan has 8" in done.stderr
