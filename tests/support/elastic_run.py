"""The python export run for real, stopped and resumed (not a test module): what
tests/core/test_python_resume.py and bench/bench_elastic.py share.

The exported skeleton runs under torchrun with the float64 toy plugged in
(support/resume_runner.py); `elastic_run` starts two torchrun agents of one process each that
meet in a c10d rendezvous on localhost (--nnodes 1:2), kills the second (its agent and its
worker: a node lost) once the run has taken some steps, and lets the first restart its worker
on half the world. `reference_params` is the uninterrupted single-process run
(app.worker.training.reference_run) the resumed run must end at.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.planner import plan as run_plan
from app.core.records.plan import Plan
from app.ports import free_port
from app.schemas.plan_requests import PlanRequestIn
from app.worker.training.reference_run import reference_run

from .recipe_toys import PairDataset, build_model, pair_loss

RUNNER = Path(__file__).with_name("resume_runner.py")
RUN_TOLERANCE = 1e-12  # a float64 run's (docs/runs.md)

# 2 processes, micro-batch 2: 6 steps an epoch, 12 in the run; on 1 process micro-batch 2 x
# accumulation 2, and 24 samples end every epoch at the same step on both sizes.
PLAN: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 4,
    "micro_batch_size": 2,
    "dataset": {"num_samples": 24, "epochs": 2, "seed": 11},
    "learning_rate": {
        "base_lr": 0.05,
        "base_batch_size": 4,
        "rule": "linear",
        "optimizer": "sgd",
        "momentum": 0.8,
        "warmup_steps": 2,
        "warmup_start_lr": 0.0,
        "decay": "cosine",
        "weight_decay": 0.01,
        "max_grad_norm": 0.5,
    },
}


def environment(tmp_path: Path, delay: float = 0.0) -> dict[str, str]:
    """The skeleton must run without this project: an `app` that refuses to load comes first."""
    shadow = tmp_path / "shadow" / "app"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('the skeleton imported app')\n")
    return {
        **os.environ,
        "PYTHONPATH": str(shadow.parent),
        "OMP_NUM_THREADS": "1",
        "RESUME_RUNNER_DELAY": str(delay),
    }


def skeleton(tmp_path: Path, body: dict[str, Any] = PLAN) -> tuple[Path, Plan]:
    request = PlanRequestIn.model_validate(body).to_core()
    planned = run_plan(request)
    path = tmp_path / "train.py"
    path.write_text(export("python", ExportInput(request, planned)).text)
    return path, planned


def program(path: Path, out: Path, *skeleton_args: str, log_every: bool = True) -> list[str]:
    """The runner's arguments: the skeleton, the toy's samples, where rank 0 writes its parameters
    (the DDP skeleton logs every step with --log-every 1; the mesh skeleton always does)."""
    logs = ["--log-every", "1"] if log_every else []
    return [str(RUNNER), str(path), "24", str(out), *logs, "--checkpoint-every", "1", *skeleton_args]


def torchrun(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc): torchrun's agent starts its workers in sessions of
    their own, so killing the agent's process group leaves them running."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def kill_node(proc: subprocess.Popen[bytes]) -> None:
    """A node lost at once: its agent and every worker it started, SIGKILLed."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def finish(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """The agent's exit status; on a hang it and its workers are killed, never left behind."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_node(proc)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def reference_params(planned: Plan) -> dict[str, torch.Tensor]:
    assert planned.sampler is not None
    return reference_run(
        planned, build_model(), PairDataset(planned.sampler.total_size), pair_loss
    ).final_params


def relative(params: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    return max(float((params[k] - v).norm() / v.norm()) for k, v in reference.items())


def elastic_run(tmp_path: Path, kill_at_step: int = 4, delay: float = 0.15) -> dict[str, Any]:
    """Two agents, the second killed once the run has taken `kill_at_step` steps: the first
    agent's exit status and log, the second's log, rank 0's final parameters, the plan, and the
    seconds from the first agent's start to its end."""
    path, planned = skeleton(tmp_path)
    env, out, port = environment(tmp_path, delay), tmp_path / "params.pt", free_port()

    def agent(host: bool) -> list[str]:
        return [
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "resume",
            # The first agent hosts the rendezvous store (both run on this host, so say which).
            # Both start at once: a node that joins after the others started training makes
            # them re-form, and torch 2.13's agents then never complete that round (the joiner
            # waits for the store address of the new round, which rank 0 published only in its
            # first). After the loss the survivor waits for the lost node's heartbeats to lapse
            # (keep_alive_interval x keep_alive_max_attempt; 5 s x 3 by default), then
            # last_call_timeout for more nodes.
            "--rdzv-conf",
            f"is_host={str(host).lower()},last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2",
            *program(path, out, "--checkpoint", str(tmp_path / "ckpt.pt")),
        ]

    logs = [tmp_path / "agent0.log", tmp_path / "agent1.log"]
    started = time.monotonic()
    first = torchrun(agent(True), env, logs[0], tmp_path)
    second = torchrun(agent(False), env, logs[1], tmp_path)
    killed_at = None
    try:
        both = lambda: logs[0].read_text() + logs[1].read_text()  # noqa: E731
        wait_for(lambda: f"step {kill_at_step} loss" in both(), 120, f"step {kill_at_step}")
        kill_node(second)
        killed_at = time.monotonic() - started
        code = finish(first, 120)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                kill_node(proc)
    return {
        "code": code,
        "log": logs[0].read_text(),
        "lost_log": logs[1].read_text(),
        "params": torch.load(out) if out.exists() else None,
        "plan": planned,
        "seconds": time.monotonic() - started,
        "killed_at": killed_at,
    }
