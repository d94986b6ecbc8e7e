"""The export formats by name: one line per format. The web layer and the CLI list and look
formats up here; a new format is one module and one line below."""

from __future__ import annotations

import dataclasses
import re

from app.core.errors.domain import DomainError, InvalidValue, NotFound
from app.core.errors.suggestions import keep_working, with_request_fields
from app.core.exports.accelerate import export_accelerate
from app.core.exports.deepspeed import export_deepspeed
from app.core.exports.hf_trainer import export_hf_trainer
from app.core.exports.kubernetes import export_kubernetes
from app.core.exports.lightning import export_lightning
from app.core.exports.megatron import export_megatron
from app.core.exports.parts.export_types import (
    Export,
    Exporter,
    ExportInput,
    ExportOptions,
    ExportUnsupported,
)
from app.core.exports.parts.hf_trainer_packed import require_rows
from app.core.exports.parts.packed_tools import refuse_budget
from app.core.exports.python_skeleton import export_python
from app.core.exports.slurm import export_slurm
from app.core.exports.torchrun import export_torchrun
from app.core.exports.torchtitan import export_torchtitan
from app.core.planner import law_request, plan
from app.core.records.plan_request import PlanRequest


def _exports(exporter: Exporter, request: PlanRequest, options: ExportOptions) -> bool:
    try:
        exporter(ExportInput(law_request(request), plan(request), options))
    except DomainError:
        return False
    return True


def _suggesting_what_exports(exporter: Exporter) -> Exporter:
    """`exporter`, whose refusals suggest only changes with which the request exports in that
    format: a value that evens out a plan for Accelerate is no use if Accelerate then refuses
    its tensor parallelism."""

    def run(x: ExportInput) -> Export:
        try:
            # A law's batch and lr are written into the request the format reads and re-plans.
            return exporter(dataclasses.replace(x, request=law_request(x.request)))
        except DomainError as err:
            works = lambda request: _exports(exporter, request, x.options)  # noqa: E731
            raise with_request_fields(x.request, err, works, trusted=frozenset()) from None

    return run


# The order is the order formats are listed in (404 details, OpenAPI examples, the CLI).
_FORMATS: dict[str, Exporter] = {
    "torchrun": export_torchrun,
    "slurm": export_slurm,
    "kubernetes": export_kubernetes,
    "deepspeed": export_deepspeed,
    "accelerate": export_accelerate,
    "hf-trainer": export_hf_trainer,
    "lightning": export_lightning,
    "python": export_python,
    "torchtitan": export_torchtitan,
    "megatron": export_megatron,
}


# The formats that write a stream plan's splitter.
_WRITE_A_STREAM = frozenset({"python", "torchtitan", "hf-trainer", "accelerate"})


def _refusing_streams(name: str, exporter: Exporter) -> Exporter:
    """`exporter`, which writes a sampler's loader: a stream plan (no sampler, a splitter) is
    refused at the dataset's kind rather than exported as a map-style dataset."""

    def run(x: ExportInput) -> Export:
        if x.plan.stream is not None and name not in _WRITE_A_STREAM:
            raise ExportUnsupported(
                f"the {name} export writes a map-style dataset's sampler, not a stream's splitter: the "
                "python export builds the stream as the plan's `stream` says, the hf-trainer and accelerate "
                'exports split it with split_dataset_by_node (end_of_epoch "drop"), and the torchtitan '
                'export writes its repeat and steps (end_of_epoch "steps"; docs/streams.md)',
                pointer="/dataset/kind",
            )
        return exporter(x)

    return run


# The formats that use a model factory: the launchers' preflight and the python skeleton.
_TRAIN_A_FACTORY = frozenset({"torchrun", "slurm", "kubernetes", "python"})


def _refusing_factory(name: str, exporter: Exporter) -> Exporter:
    """`exporter`, which writes no model: a factory given to it is refused, not dropped."""

    def run(x: ExportInput) -> Export:
        if x.options.model_factory is not None and name not in _TRAIN_A_FACTORY:
            raise ExportUnsupported(
                f"model_factory: the {name} export writes no model, so it cannot use "
                f"{x.options.model_factory}; the python export builds its loop around it, and the "
                "torchrun, slurm and kubernetes exports' preflight checks it",
                pointer="/query/model_factory",
            )
        return exporter(x)

    return run


EXPORTERS: dict[str, Exporter] = {
    name: _suggesting_what_exports(_refusing_factory(name, _refusing_streams(name, f)))
    for name, f in _FORMATS.items()
}


def plan_and_export(fmt: str, request: PlanRequest, options: ExportOptions) -> Export:
    """The request planned and written in `fmt` (a KeyError for an unknown one). A request the
    planner refuses is suggested only changes with which it then exports in `fmt` too: the
    batch that plans is no use if the format then refuses the cluster."""
    exporter = EXPORTERS[fmt]
    if request.packing is not None and fmt == "hf-trainer":
        require_rows(request)  # before planning: no suggestion makes the Trainer run a budget
    elif request.packing is not None and fmt in ("megatron", "torchtitan"):
        refuse_budget(fmt, request)  # before planning, as the Trainer's
    elif request.packing is not None and fmt != "python":
        # The other formats write padded rows with equal micro-batches a rank; written for a packed
        # plan, they would train another loop than the one planned.
        raise InvalidValue(
            f"the {fmt} export does not yet write packed rows or token budgets; plan with packing "
            "for the numbers and warnings, export without it",
            pointer="/packing",
        )
    try:
        planned = plan(request)
    except DomainError as err:
        raise keep_working(request, err, lambda changed: _exports(exporter, changed, options)) from None
    return exporter(ExportInput(request, planned, options))


def export(fmt: str, x: ExportInput) -> Export:
    """Raises KeyError for an unknown format (the web layer answers 404 with `EXPORTERS`)."""
    return EXPORTERS[fmt](x)


def unknown_format(fmt: str) -> NotFound:
    """The error for a name not in `EXPORTERS`, listing the known ones. The name is echoed
    back, so it is cut short and anything but name characters is masked."""
    shown = re.sub(r"[^A-Za-z0-9_.-]", "?", fmt[:40])
    return NotFound(f"unknown export format '{shown}'; known formats: {', '.join(EXPORTERS)}")
