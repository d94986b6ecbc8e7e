"""HTTP models of what the worker says about itself: GET /v1/host and GET /v1/check-models.
They document the records of app.contract.host for OpenAPI; tests/api/test_host_records.py
holds their fields to those records."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.contract.model_registry import PROBE_PENDING, SYNTHETIC
from app.schemas.types import with_examples


class CheckModelOut(BaseModel):
    name: str
    status: Literal["pending", "loaded", "failed"] = Field(
        description="pending: a rank is still building the model and running a forward and backward "
        "pass on two samples (right after start-up; a check of it may already be submitted). loaded: "
        "it trains. failed: it cannot be built or trained here, `error` says why, and a check of it "
        "is refused (422 at /model). A factory whose module is not installed stops start-up instead.",
        examples=["pending"],
    )
    status_detail: str | None = Field(
        description="While pending, a sentence saying so; null otherwise.",
        examples=[PROBE_PENDING],
    )
    loaded: bool | None = Field(description="null while `status` is pending.")
    error: str | None
    description: str | None
    parameters: int | None
    dataset_size: int | None
    sequence_length: int | None = Field(
        None,
        description="Tokens per sample when the dataset yields token ids (what a tokens check "
        "compares with the plan's sequence_length); null otherwise, and while pending.",
        examples=[16],
    )
    default: bool


class CheckModelsOut(BaseModel):
    models: list[CheckModelOut]


class ExposureOut(BaseModel):
    listening: list[str] = Field(
        description="The addresses this server listens on (0.0.0.0 and [::]: every interface).",
        examples=[["0.0.0.0:8001"]],
    )
    api_key: bool = Field(
        description="An API key (BATCHPLAN_API_KEY) guards the worker's routes.", examples=[False]
    )
    warning: str | None = Field(
        description="Set when the worker runs checks for anyone who can reach it: no API key, and "
        "it listens beyond loopback (also logged at start-up).",
        examples=[
            "the worker runs checks for anyone who can reach 0.0.0.0:8001: no API key is set; set "
            "BATCHPLAN_API_KEY (the worker's routes then require it), or bind to 127.0.0.1"
        ],
    )


class HostProcessOut(BaseModel):
    pid: int | None = Field(description="null while the process starts.")
    state: Literal["warming", "idle", "busy", "dead"]


class HostOut(BaseModel):
    model_config = with_examples(
        {
            "worker_enabled": True,
            "ready": True,
            "not_ready_reason": None,
            "failing": None,
            "processes_per_host": 2,
            "warm_processes": 2,
            "busy_processes": 0,
            "processes": [{"pid": 4711, "state": "idle"}, {"pid": 4712, "state": "idle"}],
            "gpus": 0,
            "gpu_names": [],
            "cuda_available": False,
            "backends": ["gloo"],
            "torch_version": "2.13.0+cpu",
            "spawn_error": None,
            "queued": 0,
            "running": 0,
            "queue_size": 64,
            "concurrent_checks": 1,
            "max_replicas_per_check": 64,
            "check_timeout_s": 120.0,
            "models": [
                {
                    "name": SYNTHETIC,
                    "status": "loaded",
                    "status_detail": None,
                    "loaded": True,
                    "error": None,
                    "description": "the built-in model: an 8-16-4 tanh MLP on synthetic samples",
                    "parameters": 212,
                    "dataset_size": None,
                    "sequence_length": None,
                    "default": True,
                }
            ],
            "exposure": {"listening": ["127.0.0.1:8001"], "api_key": False, "warning": None},
        }
    )

    worker_enabled: bool
    ready: bool = Field(description="Every rank process is warm.")
    not_ready_reason: str | None = Field(None, description="Why not ready; null when ready.")
    failing: str | None = Field(None, description="Set while rank processes keep failing to start.")
    processes_per_host: int
    warm_processes: int
    busy_processes: int = 0
    processes: list[HostProcessOut] = []
    gpus: int | None = Field(description="null until the first rank process is warm.")
    gpu_names: list[str] = []
    cuda_available: bool | None = Field(None, description="null until the first rank process is warm.")
    backends: list[str]
    torch_version: str | None = Field(None, description="The ranks' torch; null until one is warm.")
    spawn_error: str | None = Field(None, description="Why the last rank process start failed, if one did.")
    queued: int = 0
    running: int = 0
    queue_size: int | None = Field(None, description="Checks that may wait; null without the worker.")
    concurrent_checks: int | None = None
    max_replicas_per_check: int | None = None
    check_timeout_s: float | None = Field(None, description="The longest timeout_s a check may ask for.")
    models: list[CheckModelOut] = Field([], description="As GET /v1/check-models lists them.")
    exposure: ExposureOut | None = Field(
        None,
        description="Who can reach the worker: where it listens and whether a key guards it.",
        examples=[{"listening": ["127.0.0.1:8001"], "api_key": True, "warning": None}],
    )
