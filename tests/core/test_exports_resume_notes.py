"""The trainer exports' words on a resume: with the plan request's resume, each says how to
resume in its tool with the plan's numbers on the new size, or what the tool does wrong, with
its issue; without one, nothing of it."""

from __future__ import annotations

from typing import Any

import pytest
from support.bodies import sample_plan

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn

BODY = sample_plan(1, 4, 12, 3, {"num_samples": 96, "epochs": 2})
TOOLS = {
    "hf-trainer": [
        "per_device_train_batch_size=3 and",
        "gradient_accumulation_steps=2",
        "transformers#14554",
    ],
    "accelerate": ["accelerator.skip_first_batches(loader,", "sampler.set_epoch(1)", "accelerate#2016"],
    "lightning": ["drop its first 18 indices", "skips no data"],
}


def _text(fmt: str, body: dict[str, Any]) -> str:
    request = PlanRequestIn.model_validate(body).to_core()
    return export(fmt, ExportInput(request, plan(request))).text


@pytest.mark.parametrize("fmt", list(TOOLS))
def test_each_trainer_export_says_how_to_resume_there(fmt: str) -> None:
    text = " ".join(
        line.lstrip("# ").strip()
        for line in _text(
            fmt, {**BODY, "resume": {"optimizer_step": 11, "data_parallel_size": 2}}
        ).splitlines()
    )
    assert "Resume (the plan's resume): step 11, epoch 1 step 3 of it, on 2 processes" in text
    for words in TOOLS[fmt]:
        assert words in text, (fmt, words)
    assert "Resume (the plan's resume)" not in _text(fmt, BODY)
