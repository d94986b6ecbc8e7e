"""`batchplan plan --resume-step / --resume-samples / --resume-replicas`: the plan request's
`resume`, the same answer here and on a server, its table, and its refusals; and the launch
exports' elastic flags."""

from __future__ import annotations

import json

from support.cli import Invoke, both
from support.servers import Server

from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn

FLAGS = [
    "--num-nodes",
    "1",
    "--gpus-per-node",
    "4",
    "-b",
    "12",
    "-m",
    "3",
    "--num-samples",
    "100",
    "--epochs",
    "2",
]


def test_the_resume_flags_are_the_requests_resume(run: Invoke, server: Server) -> None:
    args = [
        *FLAGS,
        "--base-lr",
        "0.1",
        "--decay",
        "cosine",
        "--resume-step",
        "11",
        "--resume-replicas",
        "2",
        "--json",
    ]
    local, remote = both(run, server, "plan", *args)
    assert local.exit_code == remote.exit_code == 0, local.stderr + remote.stderr
    assert json.loads(local.stdout) == json.loads(remote.stdout)
    body = {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 12,
        "micro_batch_size": 3,
        "dataset": {"num_samples": 100, "epochs": 2},
        "learning_rate": {"base_lr": 0.1, "decay": "cosine"},
        "resume": {"optimizer_step": 11, "data_parallel_size": 2},
    }
    expected = plan(PlanRequestIn.model_validate(body).to_core()).resume
    assert (
        expected is not None
        and json.loads(local.stdout)["resume"]["skip_micro_batches"] == expected.skip_micro_batches
    )
    by_samples = run("plan", *FLAGS, "--resume-samples", "132", "--resume-replicas", "2", "--json")
    assert json.loads(by_samples.stdout)["resume"]["step_in_epoch"] == 2


def test_the_table_says_where_each_rank_goes_on(run: Invoke) -> None:
    out = run("plan", *FLAGS, "--resume-step", "11", "--resume-replicas", "2").stdout
    assert (
        "resume at step 11 (132 samples): epoch 1, step 2 of it, on 2 replicas (micro 3, accumulation 2)"
        in out
    )
    assert "exact with --resume-replicas 4" in out


def test_a_resume_past_the_runs_end_is_refused_with_the_last_step(run: Invoke) -> None:
    result = run("plan", *FLAGS, "--resume-step", "18")
    assert result.exit_code == 2
    assert "past the run's end" in result.stderr and "try --resume-step 17" in result.stderr


def test_the_export_flags_launch_elastically(run: Invoke) -> None:
    args = ["--num-nodes", "2", "--gpus-per-node", "2", "-b", "8", "-m", "2"]
    out = run("export", "torchrun", *args, "--elastic-nodes", "1:2", "--max-restarts", "4").stdout
    assert "--nnodes 1:2" in out and "--max-restarts 4" in out
    refused = run("export", "torchrun", *args, "--elastic-nodes", "1:3")
    assert refused.exit_code == 2 and "on 3 nodes" in refused.stderr
