"""The training exports run for real: each tool under torchrun (gloo, CPU, float64, 2 or 3
processes) trains a toy for 2 epochs with the plan's recipe (warmup, a decay, weight decay and
clipping on), as its export says, and every optimizer step's lr, every step's loss and the
final parameters must be the single-process reference run's (app.worker.training.reference_run)
to 1e-10 relative. One torchrun runs the plans of every tool that needs its number of processes,
one after another (start-up is most of the time): python's on 3, the three trainers' on 2.

Each run is also held against references that differ from the plan in one setting (no
clipping, no weight decay, the lr without its warmup): those must be told apart, so the
comparison would catch a tool that drops that setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from export_helpers import export_input
from support.bodies import node_groups
from support.recipe_toys import DictDataset, PairDataset, build_model, dict_loss, pair_loss

from app.core.exports.registry import export
from app.core.records.plan import Plan
from app.worker.training.reference_run import ReferenceRun, reference_run

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-10


def _recipe(**recipe: Any) -> dict[str, Any]:
    return {"base_batch_size": 6, "rule": "linear", **recipe}


# 2 processes: every micro-batch of an epoch but the last is full (17 samples per replica in 3s).
EVEN_2 = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 6,
    "micro_batch_size": 3,
    "dataset": {"num_samples": 33, "epochs": 2, "seed": 7},
    "learning_rate": _recipe(
        base_lr=0.05,
        optimizer="sgd",
        momentum=0.8,
        nesterov=True,
        warmup_steps=3,
        warmup_start_lr=0.0,
        decay="cosine",
        min_lr=0.005,
        weight_decay=0.01,
        max_grad_norm=0.8,
    ),
}
# Accumulation 3 over 10 micro-batches an epoch: the last one is left over (and dropped).
ACCUMULATED_2 = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 12,
    "micro_batch_size": 2,
    "dataset": {"num_samples": 37, "epochs": 2, "seed": 3},
    "learning_rate": _recipe(
        base_lr=0.01,
        optimizer="adam",
        warmup_steps=2,
        decay="linear",
        min_lr=0.001,
        weight_decay=0.05,
        max_grad_norm=1.0,
    ),
}
EVEN_3 = {**EVEN_2, "topology": {"num_nodes": 1, "gpus_per_node": 3}, "global_batch_size": 9}
ACCUMULATED_3 = {
    **ACCUMULATED_2,
    "topology": {"num_nodes": 1, "gpus_per_node": 3},
    "global_batch_size": 18,
    "dataset": {"num_samples": 64, "epochs": 2, "seed": 3},
    # The same recipe with AdamW's decoupled weight decay.
    "learning_rate": {**ACCUMULATED_2["learning_rate"], "optimizer": "adamw", "weight_decay": 0.1},
}
# Uneven (fast GPUs take 4 a micro-step, the slow one 2), accumulation 2, step decay.
UNEVEN_3 = {
    "topology": node_groups(("fast", 1, 2, 2.0), ("slow", 1, 1, 1.0)),
    "global_batch_size": 20,
    "gradient_accumulation_steps": 2,
    "dataset": {"num_samples": 53, "epochs": 2, "seed": 5},
    "learning_rate": _recipe(
        base_lr=0.02,
        optimizer="sgd",
        warmup_steps=1,
        warmup_start_lr=0.01,
        decay="step",
        milestones=[3, 5],
        gamma=0.5,
        weight_decay=0.001,
        max_grad_norm=1.2,
    ),
}
PLANS = {
    "python": {"even": EVEN_3, "accumulated": ACCUMULATED_3, "uneven": UNEVEN_3},
    "hf-trainer": {"even": EVEN_2, "accumulated": ACCUMULATED_2},
    "accelerate": {"even": EVEN_2, "accumulated": ACCUMULATED_2},
    "lightning": {"even": EVEN_2, "accumulated": ACCUMULATED_2},
}
EXPORT_NAMES = {"python": "train.py", "hf-trainer": "training_args.py"}


def _weights(p: Plan) -> list[float]:
    """Each rank's weight of a micro-batch's loss in the step's loss: loss_scale / replicas."""
    return [g.loss_scale / p.data_parallel_size for g in p.replica_groups for _ in range(g.start, g.stop)]  # type: ignore[operator]


# The tools whose plans run on the same number of processes: one torchrun each.
LAUNCHES = [("python",), ("hf-trainer", "accelerate", "lightning")]


def _launch(tools: tuple[str, ...], tmp_path: Path) -> dict[str, dict[str, Plan]]:
    """One torchrun for the tools' plans; the plans by tool and case name."""
    cases, plans = [], {}
    for tool in tools:
        plans[tool] = {}
        for name, body in PLANS[tool].items():
            x = export_input(body)
            path = tmp_path / f"{tool}-{name}_{EXPORT_NAMES.get(tool, tool + '.txt')}"
            path.write_text(export(tool, x).text)
            plans[tool][name] = x.plan
            assert x.plan.sampler is not None
            num_samples = body["dataset"]["num_samples"]  # type: ignore[index]
            case = {"tool": tool, "name": f"{tool}-{name}", "export": str(path), "num_samples": num_samples}
            cases.append({**case, "weights": _weights(x.plan)})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    processes = {p.data_parallel_size for by_name in plans.values() for p in by_name.values()}
    assert len(processes) == 1
    # The skeleton must run without this project: a package named `app` that refuses to load
    # comes first on its path (tests/support stays reachable for the toy).
    shadow = tmp_path / "shadow" / "app"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the export imported app')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(TESTS)]),
        "OMP_NUM_THREADS": "1",
        # What `accelerate launch --cpu` sets: Accelerate (and the HF Trainer through it) runs
        # DDP over gloo on CPU, as a machine without GPUs needs.
        "ACCELERATE_USE_CPU": "true",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes.pop()),
        str(TESTS / "support" / "recipe_runner.py"),
        str(tmp_path / "cases.json"),
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a hang ends every rank
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-6000:]
    return plans


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[dict[str, Plan], Path]]:
    """`launched(tool)`: the tool's plans by case name and the folder of their results, from its
    torchrun, started on the first test that asks (a failed one fails each test that asks)."""
    done: dict[tuple[str, ...], tuple[dict[str, dict[str, Plan]], Path] | Exception] = {}

    def get(tool: str) -> tuple[dict[str, Plan], Path]:
        tools = next(group for group in LAUNCHES if tool in group)
        if tools not in done:
            folder = tmp_path_factory.mktemp("-".join(tools))
            try:
                done[tools] = (_launch(tools, folder), folder)
            except Exception as failed:
                done[tools] = failed
                raise
        outcome = done[tools]
        if isinstance(outcome, Exception):
            raise AssertionError(f"the torchrun of {', '.join(tools)} failed") from outcome
        plans, folder = outcome
        return plans[tool], folder

    return get


def _reference(p: Plan, tool: str) -> ReferenceRun:
    n = p.sampler.total_size - p.sampler.padded_samples  # type: ignore[union-attr]
    if tool == "hf-trainer":
        return reference_run(p, build_model(), DictDataset(n), dict_loss)
    return reference_run(p, build_model(), PairDataset(n), pair_loss)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _params_off(params: dict[str, torch.Tensor], ref: ReferenceRun) -> float:
    return max(_relative(params[k], v) for k, v in ref.final_params.items())


def _changed(p: Plan, **changes: Any) -> Plan:
    assert p.learning_rate is not None
    return dataclasses.replace(p, learning_rate=dataclasses.replace(p.learning_rate, **changes))


@pytest.mark.parametrize("tool", list(PLANS))
def test_the_tools_run_follows_the_plans_recipe(
    tool: str, launched: Callable[[str], tuple[dict[str, Plan], Path]]
) -> None:
    plans, folder = launched(tool)
    for name, p in plans.items():
        got = torch.load(folder / f"{tool}-{name}.pt")
        ref = _reference(p, tool)
        assert p.learning_rate is not None and len(ref.steps) == p.learning_rate.train_steps
        assert len(got["steps"]) == len(ref.steps), (name, got["steps"])
        for step, (mine, theirs) in enumerate(zip(got["steps"], ref.steps, strict=True)):
            assert mine["lr"] == pytest.approx(theirs.lr, rel=TOLERANCE, abs=0), (name, step)
            assert mine["loss"] == pytest.approx(theirs.loss, rel=TOLERANCE), (name, step)
        assert _params_off(got["params"], ref) < TOLERANCE, name
        # The recipe is in play: the warmup, a clipped step, weight decay, a second epoch.
        assert ref.steps[0].lr < ref.steps[p.learning_rate.warmup_steps].lr, name
        assert any(s.grad_norm > p.learning_rate.max_grad_norm for s in ref.steps), name  # type: ignore[operator]
        assert ref.steps[-1].epoch == 1, name
        for changes in ({"max_grad_norm": None}, {"weight_decay": 0.0}, {"warmup_steps": 0}):
            other = _reference(_changed(p, **changes), tool)
            assert _params_off(got["params"], other) > 1e-6, (name, changes)
