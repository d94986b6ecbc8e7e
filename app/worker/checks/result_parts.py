"""The parts of a CheckResult that every workload (ddp_check, token_check, mesh_check) fills
the same way: where it ran, the split it ran, how its controls are judged, and the tolerances."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from app.worker.contract.check_result import ControlOutcome, Layout, Setup
from app.worker.contract.spec import CheckSpec, replicas_per_process
from app.worker.training.gradients import compare

# float64 on CPU agrees to ~1e-16 relative, float32 to ~1e-7; a wrong setup is off by 1e-1 or more.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
# A control counts as detected only this far above the tolerance, so the verdict is clear.
DETECTION_FACTOR = 100


def check_setup(backend: str, device: torch.device, dtype: str, nnodes: int, processes: int) -> Setup:
    return Setup(
        backend=backend,
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        dtype=dtype,
        nnodes=nnodes,
        processes=processes,
    )


def check_layout(spec: CheckSpec, processes: int, micro_batch_sizes: Sequence[int]) -> Layout:
    dp = spec.data_parallel_size
    return Layout(
        data_parallel_size=dp,
        replicas_per_process=replicas_per_process(processes, dp),
        global_batch_size=spec.global_batch_size,
        micro_batch_sizes=tuple(sorted(set(micro_batch_sizes))),
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        split=spec.split,
    )


def judged_controls(
    runs: Iterable[tuple[str, str, torch.Tensor]], reference: torch.Tensor, tolerance: float
) -> tuple[ControlOutcome, ...]:
    """Each control's gradient (name, description, gradient) against the reference: detected
    when it misses by DETECTION_FACTOR times the tolerance."""
    outcomes = []
    for name, description, gradient in runs:
        max_abs, rel = compare(gradient, reference)
        outcomes.append(ControlOutcome(name, description, rel, max_abs, rel > DETECTION_FACTOR * tolerance))
    return tuple(outcomes)
