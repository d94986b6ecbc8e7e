"""What every step kind (ddp_check, token_check, mesh/check) does alike: where it runs (the
process group it is given), the tolerances, how its controls are judged, and how its
result is assembled from the gradients it measured."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from app.contract.check_options import DType, ProcessGroupBackend
from app.contract.check_result import (
    CheckedSplit,
    CheckResult,
    Comparison,
    ControlOutcome,
    Setup,
    SkippedControl,
)
from app.contract.equivalence import Finding
from app.contract.micro_batch_search import MicroBatchSearch
from app.contract.noise_scale import NoiseScaleReport
from app.contract.spec import CheckSpec, replicas_per_process
from app.core.records.plan import Wrapper
from app.worker.checks import equivalence
from app.worker.checks.controls import Control
from app.worker.measure.noise_measurement import not_equivalent_reason
from app.worker.training.gradients import compare

# float64 on CPU agrees to ~1e-16 relative, float32 to ~1e-7; a wrong setup is off by 1e-1 or more.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
# A control counts as detected only this far above the tolerance, so the verdict is clear.
DETECTION_FACTOR = 100


@dataclass(frozen=True, slots=True)
class CheckGroup:
    """The initialised default process group a check runs on, as this rank sees it."""

    rank: int
    world: int  # processes in the check
    device: torch.device
    backend: ProcessGroupBackend
    nnodes: int = 1

    def setup(self, dtype: DType) -> Setup:
        device = self.device
        return Setup(
            backend=self.backend,
            device=device.type,
            device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            dtype=dtype,
            nnodes=self.nnodes,
            processes=self.world,
        )


def check_layout(spec: CheckSpec, micro_batch_sizes: Sequence[int], replicas_per_rank: int) -> CheckedSplit:
    return CheckedSplit(
        data_parallel_size=spec.data_parallel_size,
        replicas_per_process=replicas_per_rank,
        global_batch_size=spec.global_batch_size,
        micro_batch_sizes=tuple(sorted(set(micro_batch_sizes))),
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        split=spec.split,
    )


def judged_controls(
    runs: Iterable[tuple[Control, torch.Tensor | None]], reference: torch.Tensor, tolerance: float
) -> tuple[ControlOutcome, ...]:
    """Each control's gradient against the reference: detected when it misses by
    DETECTION_FACTOR times the tolerance. A None gradient: the control's collective hung."""
    outcomes = []
    for control, gradient in runs:
        if gradient is None:
            outcomes.append(ControlOutcome.hung_outcome(control.name, control.description))
            continue
        max_abs, rel = compare(gradient, reference)
        detected = rel > DETECTION_FACTOR * tolerance
        outcomes.append(ControlOutcome(control.name, control.description, rel, max_abs, detected))
    return tuple(outcomes)


@dataclass(frozen=True, slots=True)
class Measured:
    """What a check kind measured on rank 0, for `judged_result` to judge."""

    gradient: torch.Tensor  # the plan's step
    reference: torch.Tensor  # one process, the mean loss over the global batch
    controls: Sequence[tuple[Control, torch.Tensor | None]]  # each control that ran, its step (None: hung)
    skipped: Sequence[SkippedControl]
    findings: list[Finding]  # equivalence findings
    sampler_checked: bool
    micro_batch_sizes: Sequence[int]  # every replica's, as the check ran them


def judged_result(
    spec: CheckSpec,
    group: CheckGroup,
    model: str,
    measured: Measured,
    *,
    replicas_per_rank: int | None = None,
    noise: NoiseScaleReport | None = None,
    search: MicroBatchSearch | None = None,
    mesh: dict[str, list[Any]] | None = None,
    wrapper: Wrapper = "ddp",
    warnings: tuple[str, ...] = (),
) -> CheckResult:
    """The check's result: the plan's gradient and each control's against the reference, the
    verdict on DDP equivalence (a noise scale is not trusted without it), where it ran."""
    tolerance = TOLERANCE[spec.dtype]
    gradient = Comparison(*compare(measured.gradient, measured.reference), tolerance=tolerance)
    verdict = equivalence.verdict(measured.findings, gradient.matches, gradient.rel_l2, tolerance)
    if noise is not None and not verdict.equivalent:
        noise = noise.distrusted([not_equivalent_reason(verdict.summary)])
    per_rank = replicas_per_process(group.world, spec.data_parallel_size)
    return CheckResult(
        model=model,
        ddp_equivalence=verdict,
        setup=group.setup(spec.dtype),
        layout=check_layout(spec, measured.micro_batch_sizes, replicas_per_rank or per_rank),
        gradient=gradient,
        controls=judged_controls(measured.controls, measured.reference, tolerance),
        controls_skipped=tuple(measured.skipped),
        sampler_checked=measured.sampler_checked,
        noise_scale=noise,
        micro_batch_search=search,
        timings={},  # the driver's, once every kind has run
        torch_version=torch.__version__,
        mesh=mesh,
        wrapper=wrapper,
        workload=spec.workload,
        warnings=warnings,
    )
