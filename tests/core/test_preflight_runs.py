"""The launch exports' preflight with preflight_steps: the check request carries the plan's
recipe and the steps; under a real torchrun the preflight trains that run before training and
says so; a run that leaves the reference stops the job with the step where it did."""

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
from export_helpers import export_input

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.parts.preflight import check_request
from app.core.exports.registry import export
from app.core.request.parse import plan_request

RECIPE = {"base_lr": 0.1, "rule": "none", "warmup_steps": 2, "warmup_start_lr": 0.0, "max_grad_norm": 0.5}
PLAN = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 16,
    "micro_batch_size": 4,
    "dataset": {"num_samples": 64, "seed": 1},
    "learning_rate": RECIPE,
}


def _options(body: dict[str, Any], **options: Any) -> ExportInput:
    x = export_input(body)
    return replace(x, options=replace(x.options, preflight=True, **options))


def test_a_preflight_of_several_steps_sends_the_recipe_and_one_step_sends_the_plan_as_before() -> None:
    x = _options(PLAN, preflight_steps=6)
    request = json.loads(check_request(x))
    assert request["steps"] == 6
    assert plan_request(request["plan"]) == x.request  # the recipe included
    one = json.loads(check_request(_options(PLAN)))
    assert "steps" not in one and "learning_rate" not in one["plan"]
    said = " ".join(line.removeprefix("# ") for line in export("torchrun", x).text.splitlines())
    assert "a run of 6 steps of its recipe" in said  # the comment, however it is wrapped


def _script(tmp_path: Path, text: str, torchrun: str) -> subprocess.CompletedProcess[str]:
    """The export's script, its torchrun the given bash body; train.py prints `training`."""
    (tmp_path / "train.py").write_text("print('training')\n")
    tool = tmp_path / "bin" / "torchrun"
    tool.parent.mkdir()
    tool.write_text("#!/bin/bash\n" + torchrun)
    tool.chmod(0o755)
    path = f"{tool.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        ["bash", "-c", text], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_under_a_real_torchrun_the_preflight_trains_the_run_then_training_starts(tmp_path: Path) -> None:
    text = export("torchrun", _options(PLAN, preflight_steps=4)).text
    real = f'exec {shlex.quote(sys.executable)} -m torch.distributed.run "$@"\n'
    done = _script(tmp_path, text, real)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batchplan preflight passed: 2 processes on 1 node(s)" in done.stdout
    assert "a run of 4 steps ending" in done.stdout and "training" in done.stdout


def test_a_run_that_left_the_reference_stops_the_job_and_says_where(tmp_path: Path) -> None:
    """A stand-in torchrun prints, for the check, a run whose third step left the reference."""
    steps = [
        {
            "step": k,
            "params_rel_l2": 0.0 if k < 2 else 0.01,
            "loss": 1.0,
            "reference_loss": 1.0 + k,
            "within_tolerance": k < 2,
        }
        for k in range(4)
    ]
    failed = {
        "passed": False, "processes": 2, "nnodes": 1, "micro_batch_sizes": [4],
        "gradient_accumulation_steps": 2, "global_batch_size": 16, "rel_l2": 1e-16, "tolerance": 1e-10,
        "controls": [],
        "ddp_equivalence": {"equivalent": True, "summary": "DDP-equivalent", "findings": []},
        "steps": 4, "trajectory": steps, "final_params_rel_l2": 0.01,
    }  # fmt: skip
    text = export("torchrun", _options(PLAN, preflight_steps=4)).text
    stand_in = f'if [ "$6" = -m ]; then echo {shlex.quote(json.dumps(failed))}; else python "$6"; fi\n'
    done = _script(tmp_path, text, stand_in)
    assert done.returncode == 1, done.stdout
    assert "batchplan preflight FAILED, training not started" in done.stderr
    assert "the run left the single-process run at step 2 (parameters 0.01 apart" in done.stderr
    assert "training" not in done.stdout
