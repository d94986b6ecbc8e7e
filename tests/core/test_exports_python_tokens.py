"""The python skeleton of a token-normalised plan: its loss under torchrun (2 gloo processes),
and its per-micro-batch scales against the plan's rule on a real one-process group."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from test_exports_python_run import _finish, _start

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.planner import plan
from app.ports import free_port
from app.schemas.plan_requests import PlanRequestIn

TOKENS = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "sequence_length": 8,
    "global_batch_tokens": 96,  # 12 sequences
    "micro_batch_tokens": 24,  # 3 per micro-batch: 2 accumulation steps x 2 ranks
    "loss_normalization": "token",
    "dataset": {"num_samples": 100, "epochs": 2},
    "learning_rate": {"base_lr": 0.05, "base_batch_size": 12, "warmup_steps": 2},
}


def _skeleton(body: dict[str, Any]) -> str:
    request = PlanRequestIn.model_validate(body).to_core()
    return export("python", ExportInput(request, plan(request))).text


@pytest.mark.slow
def test_the_token_skeleton_trains_under_torchrun(tmp_path: Path) -> None:
    out = _finish(_start(TOKENS, tmp_path, "tokens"))
    # The exit-time abort of issue 14 can follow "done": the run itself is what is checked here.
    assert "done: 3 optimizer steps" in out, out
    losses = [float(v) for v in re.findall(r"step \d+ loss (\S+)", out)]
    assert len(losses) == 3 and all(math.isfinite(v) and v > 0 for v in losses), out


def test_the_skeletons_scales_weigh_every_valid_token_of_the_step_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    text = _skeleton({**TOKENS, "topology": {"num_nodes": 1, "gpus_per_node": 1}})
    assert 'LOSS_NORMALIZATION = "token"' in text
    namespace: dict[str, Any] = {"__name__": "skeleton"}
    exec(compile(text, "train.py", "exec"), namespace)
    namespace["TOY"] = True
    dataset = namespace["build_dataset"]()
    loader = torch.utils.data.DataLoader(dataset, batch_size=3)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the rendezvous, not left behind for later tests
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    accumulation = namespace["GRADIENT_ACCUMULATION_STEPS"]
    try:
        # The world size the run has: the skeleton's elastic table may restart it on another.
        scaled = list(namespace["with_loss_scales"](loader, None, accumulation, 1, torch.device("cpu")))
    finally:
        dist.destroy_process_group()
    assert accumulation == 4 and len(scaled) == len(loader) // accumulation * accumulation
    for first in range(0, len(scaled), accumulation):
        step = scaled[first : first + accumulation]
        valid = sum(int((t != -100).sum()) for _, t, _ in step)
        lengths = {int((t != -100).sum()) for _, t, _ in step}
        assert len(lengths) > 1  # uneven micro-batches: where a per-micro-batch mean goes wrong
        assert {s for _, _, s in step} == {1 / valid}  # data_parallel_size 1 / the step's tokens
