"""The types every export format shares: its options, its input (the request and the plan),
its output, the refusal of a plan the format cannot express, and an exporter's signature."""

from __future__ import annotations

from collections.abc import Callable

from app.core.errors.domain import PlanError
from app.core.records.plan import Plan
from app.core.records.plan_request import PlanRequest
from app.core.records.record import record


@record
class ExportOptions:
    script: str = "train.py"  # what torchrun starts on every node
    job_name: str = "batchplan"  # Slurm job name, PyTorchJob metadata.name (RFC 1123)
    image: str = "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
    port: int = 29500  # rendezvous / master port
    # Megatron's --rampup-batch-size: start, increment, ramp-up samples (the megatron export).
    rampup: tuple[int, int, int] | None = None
    # The launch exports (slurm, torchrun, kubernetes): see preflight.py and slurm.py.
    preflight: bool = False  # run the gradient check of the plan before training
    model_factory: str | None = None  # package.module:factory the preflight trains
    # Optimizer steps the preflight trains: 1, its first step's gradient (the check of old);
    # more, a run of the plan's recipe held step by step against a single-process run.
    preflight_steps: int = 1
    setup: str | None = None  # a shell line that activates the job's environment
    cpus_per_gpu: int = 4  # Slurm: CPU cores for each GPU's process (its DataLoader workers)
    # torchrun, slurm: an elastic launch (--nnodes=MIN:MAX, c10d rendezvous, restarts) over this
    # range of nodes; the python skeleton carries the plan for every size in it (elastic_table).
    elastic: tuple[int, int] | None = None
    max_restarts: int = 3  # torchrun's --max-restarts in an elastic launch


@record
class ExportInput:
    request: PlanRequest
    plan: Plan
    options: ExportOptions = ExportOptions()


@record
class Export:
    format: str
    media_type: str
    filename: str
    text: str


class ExportUnsupported(
    PlanError, slug="export-unsupported", title="This plan cannot be written in the requested format"
):
    """The plan is valid but this format cannot express it."""


Exporter = Callable[[ExportInput], Export]
