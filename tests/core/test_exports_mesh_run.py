"""The python export on a device mesh, run for real: torchrun, 4 gloo processes on CPU as
dp 2 x tp 2; and the mesh the launch formats state in their environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.cluster.device_mesh import rank_map
from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn

DP2_TP2 = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "parallelism": {"tensor": 2},
    "dataset": {"num_samples": 64},
}


def _input(body: dict[str, object]) -> ExportInput:
    request = PlanRequestIn.model_validate(body).to_core()
    return ExportInput(request, plan(request))


@pytest.mark.slow
def test_the_mesh_skeleton_trains_under_torchrun_and_shards_by_data_parallel_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    x = _input(DP2_TP2)
    script = tmp_path / "train.py"
    script.write_text(export("python", x).text)
    env = {**os.environ, "BATCHPLAN_TOY": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         str(script), "--max-steps", "2"],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 2 optimizer steps" in done.stdout
    # torch's own mesh gave each rank its data-parallel rank; the plan's rank map agrees
    seen = {int(r): int(d) for r, d in re.findall(r"rank (\d+): data-parallel rank (\d+) of 2", done.stdout)}
    assert x.plan.device_mesh is not None
    assert seen == {rank: dp for rank, _, dp, _, _ in rank_map(x.plan.device_mesh, 4)}
    assert seen == {0: 0, 1: 0, 2: 1, 3: 1}  # tensor peers share the data


def test_launch_formats_state_the_mesh() -> None:
    x = _input(
        {
            **DP2_TP2,
            "parallelism": {"tensor": 2, "data_parallel_shard": 2},
            "topology": {"num_nodes": 2, "gpus_per_node": 4},
        }
    )
    wanted = "MESH_DIM_NAMES=dp_replicate,dp_shard,tp MESH_SHAPE=2,2,2"
    assert wanted in export("torchrun", x).text
    assert wanted in export("slurm", x).text
    kube = export("kubernetes", x).text
    assert "DATA_PARALLEL_WRAPPER" in kube and "hsdp" in kube
    plain = _input({**DP2_TP2, "parallelism": {}})
    assert "MESH_DIM_NAMES" not in export("torchrun", plain).text  # plain DDP launches stay as they were
