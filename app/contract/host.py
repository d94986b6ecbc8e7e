"""What the worker says about itself: the check models a rank built (sent over the pipe), each
model as GET /v1/check-models lists it, the rank processes, and the host (GET /v1/host).

The HTTP models (`app.schemas.host`) document these records for OpenAPI; a test holds their
fields to these (tests/api/test_host_records.py), so that the two are never written apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from app.contract.model_registry import PROBE_PENDING, SYNTHETIC

ModelStatus = Literal["pending", "loaded", "failed"]
ProcessState = Literal["warming", "idle", "busy", "dead"]


@dataclass(frozen=True, slots=True)
class BuiltModel:
    """A registered model as one rank's factory built it, or why it could not (a forward and
    backward pass on two samples)."""

    name: str
    loaded: bool
    error: str | None = None
    description: str | None = None
    parameters: int | None = None
    dataset_size: int | None = None
    sequence_length: int | None = None  # tokens per sample when its dataset yields token ids
    model_class: str | None = None
    sync_batch_norm: tuple[str, ...] = ()  # its SyncBatchNorm layers in training mode
    parallelize: bool = False  # it names its own tensor- and pipeline-parallel split


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """One check model as GET /v1/check-models lists it."""

    name: str
    status: ModelStatus
    status_detail: str | None
    loaded: bool | None
    error: str | None
    description: str | None
    parameters: int | None
    dataset_size: int | None
    sequence_length: int | None
    default: bool


BUILT_IN = ModelDescription(
    name=SYNTHETIC,
    status="loaded",
    status_detail=None,
    loaded=True,
    error=None,
    description="the built-in model: an 8-16-4 tanh MLP on synthetic samples, one per index",
    parameters=212,
    dataset_size=None,
    sequence_length=None,
    default=True,
)


def registered_model(name: str, built: BuiltModel | None) -> ModelDescription:
    """A registered model: pending until a rank has built it, then what the rank found."""
    if built is None:
        return ModelDescription(name, "pending", PROBE_PENDING, None, None, None, None, None, None, False)
    status: ModelStatus = "loaded" if built.loaded else "failed"
    return ModelDescription(name, status, None, **_found(built), default=False)


# What a rank found of a model that the list repeats, by the same names in both records.
_FOUND = ("loaded", "error", "description", "parameters", "dataset_size", "sequence_length")


def _found(built: BuiltModel) -> dict[str, Any]:
    return {name: getattr(built, name) for name in _FOUND}


@dataclass(frozen=True, slots=True)
class ProcessDescription:
    pid: int | None  # None while the process starts
    state: ProcessState


@dataclass(frozen=True, slots=True)
class HostDescription:
    """GET /v1/host without `exposure` (which the web layer adds from its settings)."""

    worker_enabled: bool
    ready: bool
    not_ready_reason: str | None
    failing: str | None
    processes_per_host: int
    warm_processes: int
    busy_processes: int
    processes: list[ProcessDescription]
    gpus: int | None
    gpu_names: list[str]
    cuda_available: bool | None
    backends: list[str]
    torch_version: str | None
    spawn_error: str | None
    queued: int
    running: int
    queue_size: int | None
    concurrent_checks: int | None
    max_replicas_per_check: int | None
    check_timeout_s: float | None
    models: list[ModelDescription] = field(default_factory=list)
