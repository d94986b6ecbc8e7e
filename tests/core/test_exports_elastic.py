"""The exports' resume and elastic forms, without running them (tests/core/test_python_resume.py
runs them under torchrun): the python skeleton's elastic table is the plan's own resume
arithmetic, its checkpoint refuses another run's, and the torchrun and Slurm exports' elastic
launch says what torchrun and Slurm need, or is refused (422) at the option."""

from __future__ import annotations

import ast
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from support.bodies import node_groups, sample_plan

from app.core.exports.parts.elastic_table import elastic_table, run_id
from app.core.exports.parts.export_types import ExportInput, ExportOptions
from app.core.exports.registry import export
from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn

BODY = sample_plan(2, 2, 24, 3, {"num_samples": 100, "epochs": 2})
MIXED = {"topology": node_groups(("fast", 1, 2, 2.0), ("slow", 1, 2, 1.0)), "global_batch_size": 24}


def _input(body: dict[str, Any], **options: Any) -> ExportInput:
    request = PlanRequestIn.model_validate(body).to_core()
    return ExportInput(request, plan(request), ExportOptions(**options))


def test_the_skeletons_table_is_the_plans_resume_at_each_size(client: TestClient) -> None:
    x = _input(BODY)
    text = export("python", x).text
    table: dict[int, tuple[int, int, bool]] = ast.literal_eval(
        next(line for line in text.splitlines() if line.startswith("ELASTIC_TABLE = ")).split("= ", 1)[1]
    )
    assert sorted(table) == [1, 2, 3, 4]  # the divisors of 24 up to the plan's 4 replicas
    for size, (micro, accumulation, exact) in table.items():
        answer = client.post(
            "/v1/plans", json={**BODY, "resume": {"optimizer_step": 0, "data_parallel_size": size}}
        )
        resume = answer.json()["resume"]
        assert (micro, accumulation) == (resume["micro_batch_size"], resume["gradient_accumulation_steps"])
        assert micro * accumulation * size == 24
        assert exact is resume["same_global_batches"], size  # 2 epochs: the tail is always reached
    assert [e.data_parallel_size for e in elastic_table(_input(BODY, elastic=(1, 3)))] == [1, 2, 3, 4, 6]


def test_an_uneven_plans_table_holds_only_its_own_size() -> None:
    x = _input(MIXED)
    assert [(e.data_parallel_size, e.micro_batch_size) for e in elastic_table(x)] == [(4, None)]


def test_the_run_id_is_the_same_run_at_every_size_and_another_run_elsewhere() -> None:
    assert run_id(_input(BODY)) == run_id(_input({**BODY, "topology": {"num_nodes": 1, "gpus_per_node": 2}}))
    assert run_id(_input(BODY)) != run_id(_input({**BODY, "dataset": {**BODY["dataset"], "seed": 1}}))


def test_the_skeleton_refuses_to_resume_another_runs_checkpoint(tmp_path: Path) -> None:
    text = export("python", _input(BODY)).text
    namespace: dict[str, Any] = {"__name__": "skeleton"}
    exec(compile(text, "train.py", "exec"), namespace)  # defines, runs nothing (no __main__)
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    path = str(tmp_path / "ckpt.pt")

    class Wrapped:  # what save_checkpoint is given: the DDP module
        module = net

    position = {"step": 3, "epoch": 0, "step_in_epoch": 3, "data_parallel_size": 4}
    namespace["save_checkpoint"](path, Wrapped(), optimizer, scheduler, position)
    assert namespace["load_checkpoint"](path, net, optimizer, scheduler) == {
        **position,
        "run_id": namespace["RUN_ID"],
    }
    namespace["RUN_ID"] = "another-run"
    with pytest.raises(SystemExit, match="checkpoint of another run"):
        namespace["load_checkpoint"](path, net, optimizer, scheduler)


def _words(line: str) -> list[str]:
    return shlex.split(line.replace("\\\n", " "))


def test_the_torchrun_export_launches_elastically() -> None:
    text = export("torchrun", _input(BODY, elastic=(1, 2), max_restarts=5, preflight=True)).text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    training = _words(text[text.rindex("torchrun \\") :])
    assert training[training.index("--nnodes") + 1] == "1:2"
    assert training[training.index("--max-restarts") + 1] == "5"
    assert training[training.index("--rdzv-backend") + 1] == "c10d"
    # Micro-batch and accumulation follow the world size: only the global batch is exported.
    assert "export GLOBAL_BATCH_SIZE=24\n" in text and "MICRO_BATCH_SIZE" not in text
    # The preflight checks the plan on its own 2 nodes.
    preflight = _words(text[text.index('preflight="$(torchrun') :].split(")", 1)[0].split("$(", 1)[1])
    assert preflight[preflight.index("--nnodes") + 1] == "2"


def test_the_slurm_export_survives_a_lost_node() -> None:
    text = export("slurm", _input(BODY, elastic=(1, 2), preflight=False)).text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert "#SBATCH --no-kill" in text.splitlines()
    step = text[text.rindex("srun ") :]
    assert "--kill-on-bad-exit" not in step and '--nnodes "$ELASTIC_NNODES"' in step
    assert 'ELASTIC_NNODES="1:$SLURM_NNODES"' in text
    assert "--kill-on-bad-exit=1" in export("slurm", _input(BODY, preflight=False)).text


@pytest.mark.parametrize(
    ("body", "nodes", "pointer"),
    [
        (BODY, "2:1", "/query/elastic_nodes"),
        # 3 nodes of 2 GPUs: 6 replicas cannot split a global batch of 16.
        ({**BODY, "global_batch_size": 16, "micro_batch_size": None}, "1:3", "/query/elastic_nodes"),
        (MIXED, "1:2", "/topology/node_groups"),
    ],
)
def test_an_elastic_launch_that_cannot_run_is_refused_at_its_field(
    client: TestClient, body: dict[str, Any], nodes: str, pointer: str
) -> None:
    for fmt in ("torchrun", "slurm"):
        response = client.post(f"/v1/plans/export/{fmt}", params={"elastic_nodes": nodes}, json=body)
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["pointer"] == pointer
