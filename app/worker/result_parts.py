"""The parts of a CheckResult that every workload (ddp_check, token_check) fills the same way:
where it ran, and the split it ran."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from app.worker.check_result import Layout, Setup
from app.worker.spec import CheckSpec, replicas_per_process


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
