"""The run-level controls are the runs their mistakes really produce: each mistake made the
literal way under torchrun (tests/support/mistake_runner.py: DDP over gloo, torch's
DistributedSampler, LambdaLR and clip_grad_norm_, Accelerate's own prepared scheduler) trains
to the parameters, step for step, that the check's fast way (the reference run's RunVariant,
which rank 0 trains) gives; and a check whose reference follows another recipe fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.bodies import sample_plan

pytest.importorskip("torch")

import torch
from support.one_rank import one_rank_group

from app.contract.codec import encode
from app.contract.kinds.run import planned_run
from app.contract.request import build_spec, check_request
from app.core.request.parse import plan_request
from app.ports import free_port
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.run import referee as run_referee
from app.worker.checks.run.controls import RUN_CONTROLS, run_controls
from app.worker.training.reference_run import ReferenceTrainer
from app.worker.training.workload import SyntheticWorkload, load

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[3]
ROOT = TESTS.parent
STEPS = 6
# 2 replicas, accumulation 2, 3 optimizer steps an epoch; a warmup from 0, a cosine decay and
# clipping that bites: every mistake changes this run.
PLAN_LR = {
    "base_lr": 0.2,
    "rule": "none",
    "warmup_steps": 2,
    "warmup_start_lr": 0.0,
    "decay": "cosine",
    "train_steps": 8,
    "weight_decay": 0.01,
    "max_grad_norm": 0.3,
}
PLAN = sample_plan(1, 2, 8, 2, {"num_samples": 24, "seed": 5}, PLAN_LR)


@pytest.fixture(scope="module")
def literal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every mistake made the literal way, one after another in one torchrun of 2 processes."""
    tmp_path = tmp_path_factory.mktemp("mistakes")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(PLAN))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    env["ACCELERATE_USE_CPU"] = "true"
    names = [c.name for c in RUN_CONTROLS]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        str(TESTS / "support" / "mistake_runner.py"),
        ",".join(names),
        str(plan_file),
        str(STEPS),
        str(tmp_path),
    ]
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {name: torch.load(tmp_path / f"{name}.pt") for name in names}


def _fast(mistake: str) -> list[tuple[float, torch.Tensor]]:
    """The control as the check trains it: the reference run with the mistake's variant."""
    plan = planned_run(plan_request(PLAN))
    applicable, skipped = run_controls(plan, STEPS)
    assert not skipped, skipped
    [variant] = [v for c, v in applicable if c.name == mistake]
    workload = SyntheticWorkload(0)
    cpu = torch.device("cpu")

    def loss(net: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        return workload.loss(net, *workload.batch(indices, torch.float64, cpu), "mean")

    trainer = ReferenceTrainer(plan, workload.module(torch.float64, cpu), loss, variant=variant)
    return [(step.lr, trainer.flat_params().clone()) for step in trainer.steps(STEPS)]


@pytest.mark.parametrize("mistake", [c.name for c in RUN_CONTROLS])
def test_each_controls_run_is_the_mistake_made_the_literal_way(
    mistake: str, literal: dict[str, list[dict[str, Any]]]
) -> None:
    made, fast = literal[mistake], _fast(mistake)
    assert len(made) == len(fast) == STEPS
    for step, (done, (lr, params)) in enumerate(zip(made, fast, strict=True)):
        assert done["lr"] == pytest.approx(lr, rel=1e-12, abs=1e-15), (mistake, step)
        off = float((done["params"] - params).norm() / params.norm())
        assert off < 1e-12, (mistake, step, off)
    # and it is not the plan's run: the control would be detected
    right = _fast_reference()
    assert float((fast[-1][1] - right).norm() / right.norm()) > 1e-4, mistake


def _fast_reference() -> torch.Tensor:
    plan = planned_run(plan_request(PLAN))
    workload, cpu = SyntheticWorkload(0), torch.device("cpu")

    def loss(net: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        return workload.loss(net, *workload.batch(indices, torch.float64, cpu), "mean")

    trainer = ReferenceTrainer(plan, workload.module(torch.float64, cpu), loss)
    for _ in trainer.steps(STEPS):
        pass
    return trainer.flat_params()


@pytest.fixture(scope="module")
def group() -> Iterator[CheckGroup]:
    with one_rank_group() as group:
        yield group


def _run(group: CheckGroup) -> dict[str, Any]:
    spec = build_spec(check_request({"plan": PLAN, "steps": STEPS}))
    result = run_spec(spec, group, load(spec.model, None, spec.seed), None)
    assert result is not None
    return encode(result)


def test_a_reference_of_another_recipe_fails_the_check(
    group: CheckGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison can fail: the same run held against a reference with another weight
    decay leaves it at the first step with an lr above 0 (the warmup starts at 0), though the
    first step's gradient still matches."""
    assert _run(group)["passed"]
    referee = run_referee.Referee

    def other_weight_decay(plan: Any, *args: Any, **kwargs: Any) -> Any:
        assert plan.learning_rate is not None
        changed = dataclasses.replace(plan.learning_rate, weight_decay=plan.learning_rate.weight_decay * 2)
        return referee(dataclasses.replace(plan, learning_rate=changed), *args, **kwargs)

    monkeypatch.setattr("app.worker.checks.run.check.Referee", other_weight_decay)
    result = _run(group)
    assert result["gradient_matches"] and not result["passed"] and not result["trajectory_matches"]
    off = [s["step"] for s in result["trajectory"] if not s["within_tolerance"]]
    assert off == list(range(1, STEPS))
    assert result["trajectory"][1]["params_rel_l2"] > 1e-6
