"""The python export resumes, for real: the exported skeleton under torchrun (gloo, CPU, float64,
the toy of support/recipe_toys.py plugged in as a user would, support/resume_runner.py) trains
part of its run, stops, and goes on from its own checkpoint on another number of processes;
its final parameters must be the uninterrupted single-process run's
(app.worker.training.reference_run) to the run tolerance.

The FSDP skeleton stops at --max-steps and is restarted by hand on half the processes. The DDP
skeleton under torchrun's elastic agent: two agents of one process each meeting in a c10d
rendezvous on localhost (--nnodes 1:2), the second agent (not the first, whose store holds the
rendezvous) killed with SIGKILL, its worker with it, mid-run: the first agent restarts its
worker on half the world, which resumes from the 2-process checkpoint on 1 and finishes
(support/elastic_run.py, which bench/bench_elastic.py times). That run is the DDP skeleton's
resume on half the processes (a restart by hand resumed from the same checkpoint, written
every step either way, by the same code: no second pair of torchruns for it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.elastic_run import (
    PLAN,
    RUN_TOLERANCE,
    elastic_run,
    environment,
    finish,
    program,
    reference_params,
    relative,
    skeleton,
    torchrun,
)

from app.ports import free_port

pytestmark = pytest.mark.slow


def test_the_fsdp_skeleton_resumes_its_sharded_checkpoint_on_another_mesh(tmp_path: Path) -> None:
    # FSDP over 2 processes (each holds half of every parameter and its optimizer state), saved
    # with torch.distributed.checkpoint, loaded resharded onto 1 process.
    path, plan = skeleton(tmp_path, {**PLAN, "parallelism": {"data_parallel_shard": 2}})
    env, out = environment(tmp_path), tmp_path / "params.pt"
    ckpt = ["--checkpoint", str(tmp_path / "ckpt")]
    first = [
        "--standalone",
        "--nproc-per-node",
        "2",
        *program(path, out, *ckpt, "--max-steps", "5", log_every=False),
    ]
    code = finish(torchrun(first, env, tmp_path / "first.log", tmp_path), 120)
    assert code == 0, (tmp_path / "first.log").read_text()[-4000:]
    second = ["--standalone", "--nproc-per-node", "1", *program(path, out, *ckpt, log_every=False)]
    code = finish(torchrun(second, env, tmp_path / "second.log", tmp_path), 120)
    log = (tmp_path / "second.log").read_text()
    assert code == 0, log[-4000:]
    assert "world size 1: micro-batch 2 x accumulation 2" in log
    assert (
        "resumed at optimizer step 5 (epoch 0, step 5 of it) from a checkpoint of 2 data-parallel ranks on 1"
        in log
    )
    assert "done: 12 optimizer steps" in log
    off = relative(torch.load(out), reference_params(plan))
    assert off < RUN_TOLERANCE, off
    # The end of the run was saved (between two --checkpoint-every): started again, it says the
    # run is finished and trains nothing. One process, started as torchrun starts its rank (its
    # environment), without a torchrun agent of its own: the agent only costs an import of torch.
    alone = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    rank_env = {**env, **alone, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    third = subprocess.run(
        [sys.executable, *program(path, out, *ckpt, log_every=False)],
        env=rank_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    log = third.stdout + third.stderr
    assert third.returncode == 0, log[-4000:]
    assert "holds a finished run (12 optimizer steps, epoch" in log and "done:" not in log, log[-4000:]


def test_the_elastic_agent_restarts_the_run_on_half_the_world_and_it_is_the_same_run(tmp_path: Path) -> None:
    run = elastic_run(tmp_path)
    log = run["log"]
    assert run["code"] == 0, log[-6000:]
    assert "world size 2" in log + run["lost_log"]
    assert "world size 1: micro-batch 2 x accumulation 2" in log, log[-6000:]
    resumed = [line for line in log.splitlines() if "resumed at optimizer step" in line]
    assert resumed and "from a checkpoint of 2 processes on 1" in resumed[-1], log[-6000:]
    # Where it resumed, told as the step of the run and of its epoch (6 steps an epoch on 2).
    at = re.search(r"resumed at optimizer step (\d+) \(epoch (\d+), step (\d+) of it\)", resumed[-1])
    assert at, resumed[-1]
    step, epoch, of_epoch = (int(g) for g in at.groups())
    assert 0 < step < 12 and step == 6 * epoch + of_epoch, resumed[-1]
    assert "done: 12 optimizer steps" in log
    off = relative(run["params"], reference_params(run["plan"]))
    assert off < RUN_TOLERANCE, off
