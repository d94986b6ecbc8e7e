"""Every export format's text for a few representative plans, held byte for byte to the files in
tests/core/golden/exports/ (one folder per plan, one file per format; a refusal is its 422's
pointer, detail and suggestions). A change to what an export writes shows up here as a diff to
read: when it is meant, regenerate the files and review their diff in git:

    BATCHPLAN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/core/test_exports_golden.py

The plans: ImageNet's recipe (SGD, warmup, 90 epochs), a plan with nothing but a batch, a mixed
cluster split unevenly, a 2-D mesh (HSDP x tensor), the language model (tokens, Adam), a full
recipe (AdamW, accumulation with leftover micro-batches, cosine from 0 to a floor, weight decay,
clipping, a run shorter than its epochs), the launch formats with their preflight, and a stream.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import pytest
from export_helpers import export_input
from support.bodies import sample_plan

from app.core.exports.parts.export_types import ExportInput, ExportOptions, ExportUnsupported
from app.core.exports.registry import EXPORTERS, export
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES
from app.schemas.examples import STREAM_PLAN_EXAMPLES

GOLDEN = Path(__file__).with_name("golden") / "exports"
UPDATE = os.environ.get("BATCHPLAN_UPDATE_GOLDEN") == "1"
COMMAND = "BATCHPLAN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/core/test_exports_golden.py"
LAUNCHERS = ("torchrun", "slurm", "kubernetes")

RECIPE_LR = {
    "base_lr": 0.001,
    "base_batch_size": 256,
    "rule": "none",
    "optimizer": "adamw",
    "warmup_steps": 20,
    "warmup_start_lr": 0.0,
    "decay": "cosine",
    "min_lr": 0.0001,
    "weight_decay": 0.05,
    "max_grad_norm": 1.0,
    "train_steps": 500,
}
RECIPE = sample_plan(2, 4, 256, 8, {"num_samples": 50000, "epochs": 3}, RECIPE_LR)
HSDP_TENSOR = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "parallelism": {"tensor": 2, "data_parallel_shard": 4},
    "global_batch_size": 256,
    "dataset": {"num_samples": 100000, "epochs": 2},
    "learning_rate": {"base_lr": 0.1, "base_batch_size": 256, "warmup_steps": 10, "warmup_start_lr": 0.0},
}
PLANS: dict[str, tuple[dict[str, Any], ExportOptions, tuple[str, ...]]] = {
    "imagenet": (EXAMPLES["dataset_and_lr"]["value"], ExportOptions(), tuple(EXPORTERS)),
    "batch-only": (EXAMPLES["homogeneous"]["value"], ExportOptions(), tuple(EXPORTERS)),
    "mixed-cluster": (EXAMPLES["mixed"]["value"], ExportOptions(), tuple(EXPORTERS)),
    "hsdp-tensor": (HSDP_TENSOR, ExportOptions(), tuple(EXPORTERS)),
    "language-model": (EXAMPLES["language_model"]["value"], ExportOptions(), tuple(EXPORTERS)),
    "full-recipe": (RECIPE, ExportOptions(), tuple(EXPORTERS)),
    "preflight": (
        EXAMPLES["dataset_and_lr"]["value"],
        ExportOptions(
            preflight=True,
            model_factory="mypkg.models:build",
            preflight_steps=3,
            setup="source /venv/bin/activate",
        ),
        (*LAUNCHERS, "python"),
    ),
    # A stream: the python export builds its splitter, the others refuse naming it.
    "stream": (STREAM_PLAN_EXAMPLES["stream"]["value"], ExportOptions(), tuple(EXPORTERS)),
}
CASES = [(plan, fmt) for plan, (_, _, formats) in PLANS.items() for fmt in formats]


def rendered(x: ExportInput, fmt: str) -> tuple[str, str]:
    """(the file name, what the format writes for the plan or its refusal)."""
    try:
        out = export(fmt, x)
    except ExportUnsupported as err:
        lines = [f"422 {err.pointer}: {err.detail}"]
        lines += [f"suggestions {key}: {values}" for key, values in err.suggestions.items()]
        lines += [f"combined suggestion: {change}" for change in err.combined_suggestions]
        return f"{fmt}.refused.txt", "\n".join(lines) + "\n"
    # Data, not code: a `.golden` suffix keeps linters and the duplicates count off them.
    suffix = Path(out.filename).suffix or ".txt"
    return f"{fmt}{suffix}.golden", out.text


@pytest.mark.parametrize(("plan", "fmt"), CASES)
def test_each_export_is_its_golden_file(plan: str, fmt: str) -> None:
    body, options, _ = PLANS[plan]
    planned = export_input(body)
    name, text = rendered(ExportInput(planned.request, planned.plan, options), fmt)
    path = GOLDEN / plan / name
    stale = [p for p in (GOLDEN / plan).glob(f"{fmt}.*") if p.name != name]  # export <-> refusal
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for p in stale:
            p.unlink()
        return
    assert not stale, f"{plan}/{fmt} is now {name}, the golden folder holds {stale[0].name}: run {COMMAND}"
    assert path.exists(), f"no golden file {path.relative_to(GOLDEN.parent.parent)}: run {COMMAND}"
    want = path.read_text()
    if text != want:
        diff = difflib.unified_diff(
            want.splitlines(), text.splitlines(), f"golden/{plan}/{name}", "export now", lineterm="", n=2
        )
        shown = list(diff)
        pytest.fail(
            f"{plan}/{fmt} differs from its golden file ({len(shown)} diff lines); if it is meant, "
            f"run {COMMAND} and review the files' diff:\n" + "\n".join(shown[:120]),
            pytrace=False,
        )


def test_no_golden_file_is_left_over() -> None:
    """A golden file that no case writes any more (a plan or a format renamed) fails too."""
    cases = set(CASES)
    left = [
        p for p in GOLDEN.rglob("*") if p.is_file() and (p.parent.name, p.name.split(".")[0]) not in cases
    ]
    assert not left, f"{[str(p.relative_to(GOLDEN)) for p in left]}: delete them, or run {COMMAND}"
