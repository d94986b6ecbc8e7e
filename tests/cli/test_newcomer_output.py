"""What `batchplan` prints where a newcomer misread it (issue 25): the replica table's ranks are
data-parallel ranks, the micro-batch search says what was used and what the budget was, a
misspelt field in `--request` names the field meant, and an export option out of range is
suggested a value only where the export then works, as the server does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from support.cli import Invoke

from app.cli.output import show_check
from app.core.planner import plan
from app.core.split.micro_batch_search import budget_bytes
from app.schemas.plan_requests import PlanRequestIn
from app.worker.example_models import wide_mlp
from app.worker.measure.memory import probe
from tests.support.fit_report import found_report


def test_the_replica_table_counts_data_parallel_ranks_beside_the_global_rank_map(run: Invoke) -> None:
    """32 GPUs with tensor 2: 16 data-parallel ranks, 32 global ones in the mesh's map."""
    out = run("plan", "--num-nodes", "4", "--gpus-per-node", "8", "--tensor", "2", "-b", "256")
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.rstrip().endswith("loss scale"))
    assert lines[header].split()[:2] == ["dp", "ranks"]
    first, last = (int(v) for v in lines[header + 1].split()[0].split("-"))
    # The rank map: global rank -> (pp, dp, cp, tp), as init_device_mesh lays it out.
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "pp"])
    rows = [line.split() for line in lines[start + 1 :] if re.fullmatch(r"\s*\d+(\s+\d+){4}", line)]
    assert len(rows) == 32
    assert (first, last) == (0, max(int(r[2]) for r in rows)) == (0, 15)


def test_the_micro_batch_search_says_the_memory_used_and_the_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    model, data, loss = wide_mlp()
    capacity, margin = 4 << 20, 0.15
    report = found_report(model, data, loss, "cpu", capacity_bytes=capacity, safety_margin=margin, limit=512)
    found = report["max_micro_batch_size"]
    used, _ = probe(model, data, loss, found, torch.device("cpu"))
    request = {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 512,
        "max_micro_batch_size": found,
    }
    planned = plan(PlanRequestIn.model_validate(request).to_core())
    search = {
        **report,
        "planned": {
            "global_batch_size": planned.global_batch_size,
            "micro_batch_sizes": [planned.micro_batch_size],
            "gradient_accumulation_steps": planned.gradient_accumulation_steps,
            "max_micro_batch_size": found,
            "plan_request": request,
        },
    }
    result = {
        "passed": True,
        "backend": "gloo",
        "device": "cpu",
        "processes": 4,
        "data_parallel_size": 4,
        "replicas_per_process": 1,
        "max_abs_diff": 0.0,
        "rel_l2": 0.0,
        "tolerance": 1e-10,
        "controls": [],
        "micro_batch_search": search,
    }
    show_check({"id": "x", "status": "succeeded", "result": result}, as_json=False)
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("largest micro-batch")]
    # What the found micro-batch's step used, of the whole memory; the budget it had to fit.
    assert f"that fits: {found}, peak {used:,} of {capacity:,} bytes" in line
    assert f"(budget {budget_bytes(capacity, margin):,} bytes after the 15% safety margin)" in line
    assert used <= budget_bytes(capacity, margin) < capacity


def test_a_misspelt_field_in_a_request_file_names_the_field_meant(run: Invoke, tmp_path: Path) -> None:
    body = {"topology": {"num_nodes": 1, "gpu_per_node": 2}, "global_batch": 16}
    (tmp_path / "plan.json").write_text(json.dumps(body))
    out = run("plan", "--request", str(tmp_path / "plan.json"))
    assert out.exit_code == 2
    assert "/global_batch: Extra inputs are not permitted; did you mean `global_batch_size`?" in out.stderr
    assert (
        "/topology/gpu_per_node: Extra inputs are not permitted; did you mean `gpus_per_node`?" in out.stderr
    )


def test_the_cli_tries_an_export_option_as_the_server_does(run: Invoke) -> None:
    plan = ["--num-nodes", "2", "--gpus-per-node", "8"]
    out = run("export", "slurm", *plan, "-b", "512", "--cpus-per-gpu", "999")
    assert out.exit_code == 2 and "try --cpus-per-gpu 256" in out.stderr
    assert run("export", "slurm", *plan, "-b", "512", "--cpus-per-gpu", "256").exit_code == 0
    out = run("export", "slurm", *plan, "-b", "500", "--cpus-per-gpu", "999")
    assert out.exit_code == 2 and "try --cpus-per-gpu" not in out.stderr


def test_a_plan_from_the_micro_batch_alone_and_without_warmup_prints_no_placeholders(run: Invoke) -> None:
    """Issue 40: `plan -m 64` printed "global batch 512 (asked None)", and a plan without warmup
    "warmup 0 steps from 0.1"."""
    out = run("plan", "-m", "64", "--gpus-per-node", "8", "--base-lr", "0.1", "--base-batch-size", "64")
    assert out.exit_code == 0, out.stderr
    assert "None" not in out.stdout and "warmup 0 steps" not in out.stdout
    assert "global batch 512, micro 64, accumulation 1" in out.stdout
    assert "learning rate 0.8 (linear x8), no warmup" in out.stdout
    out = run("plan", "-b", "1000", "-m", "32", "--num-nodes", "2", "--divisibility", "round_down")
    assert "global batch 512 (asked 1000)" in out.stdout
    out = run("plan", "-b", "512", "--num-nodes", "2", "--base-lr", "0.1", "--warmup-steps", "5")
    assert "warmup 5 steps from 0.1" in out.stdout
