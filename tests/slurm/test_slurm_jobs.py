"""The Slurm export under a real Slurm (slurmctld, two slurmd nodes, munge): the exported sbatch
script runs the exported Python skeleton (toy mode, gloo on CPU), and the job's own output says
what each rank trained on, checked against the planner. The jobs are submitted together (one
module fixture) so that they share the cluster's two cores while they run.

Every job runs with the environment its setup line gives, the first under `--export=NONE`, in
which nothing of this process's environment reaches it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import Cluster

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.planner import plan
from app.core.records.plan import Plan
from app.schemas.plan_requests import PlanRequestIn
from app.worker.zoo.example_models import SAMPLES as EXAMPLE_SAMPLES

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What a job needs from this machine: this interpreter's torchrun and python, this checkout.
SETUP = f"export PATH={Path(sys.executable).parent}:$PATH PYTHONPATH={ROOT} BATCHPLAN_TOY=1"
RANK_LINE = re.compile(
    r"^rank (\d+)/(\d+): (\d+) optimizer steps, (\d+) micro-batches of sizes \[([\d, ]*)\], "
    r"accumulation (\d+)$",
    re.M,
)


def body(topology: dict[str, Any], global_batch: int, **fields: Any) -> dict[str, Any]:
    # The skeleton's toy data set has 4 global batches of samples: the plan is told so.
    return {
        "topology": topology,
        "global_batch_size": global_batch,
        "dataset": {"num_samples": 4 * global_batch, "epochs": 1},
        **fields,
    }


# Trained on the example factory's own data (export --model-factory): the plan is told its size,
# as the skeleton refuses a dataset of another size than the plan's.
EVEN_TWO_NODES = {
    **body({"num_nodes": 2, "gpus_per_node": 1}, 16, micro_batch_size=4),
    "dataset": {"num_samples": EXAMPLE_SAMPLES, "epochs": 1},
}
MIXED = body(
    {
        "node_groups": [
            {"name": "fast", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
            {"name": "slow", "num_nodes": 1, "gpus_per_node": 1},
        ]
    },
    40,
    divisibility="balance",
)
ONE_GPU_A = body({"num_nodes": 1, "gpus_per_node": 1}, 12, micro_batch_size=4)
ONE_GPU_B = body({"num_nodes": 1, "gpus_per_node": 1}, 8, micro_batch_size=2)
# BatchNorm normalises over each micro-batch: 4 micro-batches of 4 are not one batch of 16.
NOT_EQUIVALENT = body({"num_nodes": 1, "gpus_per_node": 1}, 16, micro_batch_size=4)


@dataclass(frozen=True)
class Job:
    id: str
    folder: Path
    plan: Plan

    def output(self) -> str:
        [out] = self.folder.glob(f"*-{self.id}.out")
        return out.read_text()


def submit(slurm: Cluster, folder: Path, request_body: dict[str, Any], *sbatch: str, **options: Any) -> Job:
    """Export `request_body` as train.py and job.sbatch into `folder` and submit the job."""
    folder.mkdir()
    request = PlanRequestIn.model_validate(request_body).to_core()
    x = ExportInput(request, plan(request))
    x = replace(x, options=replace(x.options, setup=SETUP, cpus_per_gpu=2, **options))
    (folder / "train.py").write_text(export("python", x).text)
    (folder / "job.sbatch").write_text(export("slurm", x).text)
    return Job(slurm.submit(folder / "job.sbatch", *sbatch), folder, x.plan)


@pytest.fixture(scope="module")
def jobs(slurm: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("jobs")
    node = slurm.nodes[0]
    # In this order: Slurm starts jobs first come, first served, and the two jobs that share a
    # node must run at the same time.
    return {
        # Two jobs pinned to one node, started together: each must find its own rendezvous.
        "same_node_a": submit(slurm, root / "a", ONE_GPU_A, f"--nodelist={node}", job_name="a"),
        "same_node_b": submit(slurm, root / "b", ONE_GPU_B, f"--nodelist={node}", job_name="b"),
        "even": submit(
            slurm,
            root / "even",
            EVEN_TWO_NODES,
            "--export=NONE",
            preflight=True,
            model_factory="app.worker.example_models:mlp",
        ),
        "mixed": submit(slurm, root / "mixed", MIXED),
        "wrong": submit(
            slurm,
            root / "wrong",
            NOT_EQUIVALENT,
            preflight=True,
            model_factory="app.worker.example_models:batchnorm_mlp",
        ),
    }


def finished(slurm: Cluster, job: Job) -> str:
    state = slurm.wait(job.id)
    assert state == "COMPLETED", f"job {job.id} ended {state}:\n{job.output()[-3000:]}"
    return job.output()


def assert_ranks_followed_the_plan(output: str, the_plan: Plan) -> None:
    """Every rank's own report: the planner's micro-batch for its rank, its accumulation, and
    the planner's optimizer steps for the epoch."""
    reports = {int(m[1]): m for m in RANK_LINE.finditer(output)}
    world = the_plan.data_parallel_size
    assert sorted(reports) == list(range(world)), output[-3000:]
    assert the_plan.sampler is not None
    steps = the_plan.sampler.total_optimizer_steps
    accumulation = the_plan.gradient_accumulation_steps
    for group in the_plan.replica_groups:
        for rank in range(group.start, group.stop):
            _, of, rank_steps, micro_steps, sizes, rank_accumulation = reports[rank].groups()
            assert int(of) == world
            assert (int(rank_steps), int(rank_accumulation)) == (steps, accumulation)
            assert int(micro_steps) == steps * accumulation
            assert sizes == str(group.micro_batch_size)


def test_even_plan_on_two_nodes_with_preflight_under_export_none(
    slurm: Cluster, jobs: dict[str, Job]
) -> None:
    job = jobs["even"]
    output = finished(slurm, job)
    assert "batchplan preflight passed: 2 processes on 2 node(s)" in output
    assert output.index("batchplan preflight passed") < output.index("rank 0/2")
    assert_ranks_followed_the_plan(output, job.plan)
    details = slurm.run("scontrol", "show", "job", job.id)
    # One task per node with a CPU for each of its GPUs' processes (cpus_per_gpu=2).
    assert "NumNodes=2" in details and "NumCPUs=4" in details


def test_uneven_mixed_groups_run_as_a_heterogeneous_job(slurm: Cluster, jobs: dict[str, Job]) -> None:
    job = jobs["mixed"]
    assert {g.micro_batch_size for g in job.plan.replica_groups} == {16, 8}  # really uneven
    output = finished(slurm, job)
    assert_ranks_followed_the_plan(output, job.plan)
    # The job-wide --output=%x-%j.out names the whole job's output (after the last hetjob it
    # would apply to that component only, and the batch script's output would go to slurm-%j.out).
    assert [p.name for p in job.folder.glob("*.out")] == [f"batchplan-{job.id}.out"]


def test_two_jobs_on_one_node_at_once(slurm: Cluster, jobs: dict[str, Job]) -> None:
    a, b = jobs["same_node_a"], jobs["same_node_b"]
    outputs = [finished(slurm, a), finished(slurm, b)]
    for job, output in zip((a, b), outputs, strict=True):
        assert_ranks_followed_the_plan(output, job.plan)
    spans = []
    for job in (a, b):
        details = slurm.run("scontrol", "show", "job", job.id)
        assert f"NodeList={slurm.nodes[0]}" in details
        spans.append(re.findall(r"(?:StartTime|EndTime)=(\S+)", details))
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end  # ISO times: they ran at the same time


def test_preflight_stops_a_plan_that_does_not_hold_before_training(
    slurm: Cluster, jobs: dict[str, Job]
) -> None:
    job = jobs["wrong"]
    state = slurm.wait(job.id)
    output = job.output()
    assert state == "FAILED", output[-3000:]
    assert "batchplan preflight FAILED, training not started" in output
    assert "batch_norm" in output and "micro-batches [4], accumulation 4" in output
    assert not RANK_LINE.search(output)  # the training script never ran
