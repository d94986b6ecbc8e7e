"""HTTP models of the gradient-check worker: /v1/checks* and /v1/host."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.plans import PlanRequestIn
from app.schemas.types import WHOLE

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class RendezvousIn(BaseModel):
    """One check across several worker hosts: send the same request to the worker on every
    node; they meet at `endpoint` and run as one process group."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(
        pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}$",
        examples=["node0.example:29400"],
        description="HOST:PORT; the first node on HOST serves the rendezvous there.",
    )
    nnodes: Annotated[int, Field(ge=1, le=4096), WHOLE] = Field(description="Nodes taking part.")
    run_id: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        examples=["job-4711"],
        description="The same on every node, unique per check.",
    )


class CheckRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: PlanRequestIn
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="auto: NCCL with one rank per GPU when the host has enough GPUs, else gloo on CPU.",
    )
    dtype: Literal["float64", "float32"] = "float64"
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), WHOLE] = Field(
        0, description="Seeds the model's weights, the synthetic data and (without a dataset) the shuffle."
    )
    timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = Field(
        None, description="Kill the check after this long; default and maximum from the server's settings."
    )
    rendezvous: RendezvousIn | None = None


class ControlOut(BaseModel):
    name: str
    description: str = ""
    rel_l2: float = Field(description="Relative L2 error of the wrong setup's gradient.")
    max_abs_diff: float | None = None
    detected: bool = Field(description="Its error is far above the tolerance.")


class CheckResultOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    passed: bool = Field(description="The gradient matched and every control was detected.")
    backend: str
    device: str
    processes: int
    data_parallel_size: int
    replicas_per_process: int
    max_abs_diff: float
    rel_l2: float
    tolerance: float
    controls: list[ControlOut]
    timings_s: dict[str, float]


class CheckJobOut(BaseModel):
    id: str
    status: JobStatus = Field(
        description="succeeded means the check ran; whether the plan held is result.passed."
    )
    created_at: str
    started_at: str | None
    finished_at: str | None
    result: CheckResultOut | None
    error: str | None
    request: dict[str, Any] | None = None

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> CheckJobOut:
        stored = job.get("request") or {}
        return cls.model_validate({**job, "request": stored.get("body")})


class CheckListOut(BaseModel):
    checks: list[CheckJobOut]


class HostOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    worker_enabled: bool
    ready: bool = Field(description="Every rank process is warm.")
    processes_per_host: int
    warm_processes: int
    gpus: int | None = Field(description="null until the first rank process is warm.")
    backends: list[str]


CHECK_EXAMPLES: dict[str, dict[str, Any]] = {
    "even": {
        "summary": "4 replicas, global batch 64, 2 accumulation steps",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 4},
                "global_batch_size": 64,
                "micro_batch_size": 8,
            },
            "backend": "auto",
            "dtype": "float64",
            "seed": 0,
            "timeout_s": 120,
        },
    },
    "mixed": {
        "summary": "A mixed cluster with uneven micro-batches",
        "value": {
            "plan": {
                "topology": {
                    "node_groups": [
                        {"name": "h100", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
                        {"name": "a100", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
                    ]
                },
                "global_batch_size": 60,
                "max_micro_batch_size": 8,
            }
        },
    },
}
