"""The python export of a packed or budgeted plan: its rows laid out as transformers'
DataCollatorWithFlattening lays them out, and its loop under torchrun (2 gloo processes) with
ranks running unequal micro-batch counts in the same step."""

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
from app.schemas.plan_requests import PlanRequestIn

BUDGET: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "sequence_length": 16,
    "loss_normalization": "token",
    "packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 16, "document_length": {"max": 12}},
    "learning_rate": {"base_lr": 0.05, "base_batch_size": 8},
}


def _namespace(body: dict[str, Any]) -> dict[str, Any]:
    request = PlanRequestIn.model_validate(body).to_core()
    namespace: dict[str, Any] = {"__name__": "skeleton"}
    exec(compile(export("python", ExportInput(request, plan(request))).text, "train.py", "exec"), namespace)
    return namespace


def test_the_packed_rows_are_the_collators() -> None:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rows = _namespace({**BUDGET, "packing": {"mode": "rows", "document_length": {"max": 6}}})
    assert rows["PACKING"] == "rows" and rows["MAX_TOKENS_PER_MICRO_BATCH"] is None
    docs = [[3, 4, 5], [6], [7, 8, 9, 10]]
    ours = rows["flatten"](docs)
    theirs = transformers.DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": d} for d in docs])
    for key in ("input_ids", "labels", "position_ids"):
        assert ours[key].tolist() == theirs[key].tolist(), key
    stream = iter([[1] * 5] * 100)
    batches = rows["step_micro_batches"](stream)  # 2 micro-batches of 2 rows of 16
    assert [b["input_ids"].shape[1] for b in batches] == [32, 32]


@pytest.mark.slow
def test_the_budgeted_loop_trains_under_torchrun(tmp_path: Path) -> None:
    out = _finish(_start(BUDGET, tmp_path, "budget"))
    assert "done: 3 optimizer steps" in out, out
    losses = [float(v) for v in re.findall(r"step \d+ loss (\S+)", out)]
    assert len(losses) == 3 and all(math.isfinite(v) and v > 0 for v in losses), out
    counts = re.findall(r"rank (\d)/2: step (\d) micro-batches (\d+)", out)
    by_step: dict[str, set[str]] = {}
    for _, step, n in counts:
        by_step.setdefault(step, set()).add(n)
    assert len(counts) == 6 and any(len(n) > 1 for n in by_step.values()), out
