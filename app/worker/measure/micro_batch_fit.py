"""The largest micro-batch that fits in one device's memory, and a check re-planned under it.

The order of the trials is the pure `app.core.split.micro_batch_search`; each trial is one
`memory.probe`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from app.contract.check_options import DEFAULT_FIT_LIMIT, DEFAULT_FIT_OPTIMIZER
from app.contract.micro_batch_search import MemoryFit, MicroBatchSearch, ReplannedSplit, SearchedSplit
from app.contract.options import FitOptions
from app.contract.request import replan
from app.contract.spec import CheckSpec
from app.core.errors.domain import PlanError
from app.core.request.parse import request_json
from app.core.split.micro_batch_search import (
    Trial,
    affine_bytes_per_sample,
    budget_bytes,
    search_max_micro_batch,
)
from app.worker.measure.memory import check_optimizer, probe, resolve_device
from app.worker.training.workload import LossFn, Workload


# Over 60 lines: the search's bracketing and bisection share the trials' record and the device's
# budget.
def find_max_micro_batch(
    model: nn.Module,
    dataset: Dataset[Any],
    loss_fn: LossFn | None,
    device: torch.device | str,
    *,
    capacity_bytes: int | None = None,
    safety_margin: float = 0.1,
    limit: int = DEFAULT_FIT_LIMIT,
    optimizer: str = DEFAULT_FIT_OPTIMIZER,
) -> MemoryFit:
    """The largest micro-batch in [1, limit] whose training step peaks within
    `budget_bytes(capacity_bytes, safety_margin)` without running out of memory.

    On CUDA the capacity defaults to the device's total memory; on CPU it must be given.
    On CPU a trial also stops as soon as it passes the budget, so that the search never
    takes much more host memory than the budget. The model must already be on `device`.

    Returns the report (contract.micro_batch_search.MemoryFit): max_micro_batch_size (0 when
    even 1 does not fit), capacity_bytes, budget_bytes, safety_margin, device, optimizer,
    hit_limit (the limit fit, the real maximum may be larger), peak_bytes_at_max,
    bytes_per_sample (slope of the peaks of the largest trials that ran to the end; None with
    fewer than two), the trials in the order they ran, and seconds. The slope is fitted through
    the largest trials only (`activation_bound`).
    """
    started = time.perf_counter()
    device = resolve_device(device)
    check_optimizer(optimizer)
    if capacity_bytes is None:
        if device.type != "cuda":
            raise ValueError(
                f"a {device.type} device has no memory size torch can read: pass capacity_bytes "
                "(the request's memory_bytes), the memory one device may use"
            )
        capacity_bytes = int(torch.cuda.mem_get_info(device)[1])
    budget = budget_bytes(capacity_bytes, safety_margin)
    stop = budget if device.type == "cpu" else None

    def try_size(size: int) -> Trial:
        peak, error = probe(model, dataset, loss_fn, size, device, optimizer=optimizer, stop_above_bytes=stop)
        return Trial(
            micro_batch_size=size, fits=error is None and peak <= budget, peak_bytes=peak, error=error
        )

    result = search_max_micro_batch(try_size, limit=limit)
    at_max = [t.peak_bytes for t in result.trials if t.micro_batch_size == result.max_micro_batch_size]
    # Only trials that ran to the end measured their whole peak.
    complete = [(t.micro_batch_size, t.peak_bytes) for t in result.trials if t.error is None and t.peak_bytes]
    slope = affine_bytes_per_sample(activation_bound(complete))
    return MemoryFit(
        max_micro_batch_size=result.max_micro_batch_size,
        capacity_bytes=capacity_bytes,
        budget_bytes=budget,
        safety_margin=safety_margin,
        device=str(device),
        optimizer=optimizer,
        hit_limit=result.hit_limit,
        peak_bytes_at_max=at_max[0] if at_max else None,
        bytes_per_sample=None if slope is None else round(slope),
        trials=tuple(result.trials),
        seconds=round(time.perf_counter() - started, 3),
    )


def activation_bound(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (size, peak) points where the memory that grows with the batch sets the peak: the
    largest sizes, from 3/4 of the largest up (at least the two largest). At small batches
    the optimizer step's temporaries (several times the weights, for Adam) can set a peak that
    does not grow with the batch, and a line through those points has too small a slope."""
    sizes = sorted({b for b, _ in points})
    if len(sizes) < 2:
        return points
    floor = min(sizes[-2], sizes[-1] * 3 // 4)
    return [(b, p) for b, p in points if b >= floor]


def fit_micro_batch(
    spec: CheckSpec, workload: Workload, device: torch.device
) -> tuple[CheckSpec, MicroBatchSearch | None]:
    """Rank 0 finds the largest micro-batch that fits in its device's memory (the model in
    its own dtype, a real training step with the optimizer's state); every rank then
    re-plans the same global batch under that cap, with more accumulation if need be. The
    search's report is rank 0's (None on the others)."""
    fit = spec.fit or FitOptions()
    # No micro-batch larger than a replica's whole share of a step can help.
    limit = min(fit.max_micro_batch_size, max(spec.micro_batch_sizes()) * spec.gradient_accumulation_steps)
    found = torch.zeros(1, dtype=torch.int64, device=device)
    report: MemoryFit | None = None  # rank 0's
    margin = default_safety_margin(device) if fit.safety_margin is None else fit.safety_margin
    if dist.get_rank() == 0:
        module = workload.single_process_module(None, device)
        report = find_max_micro_batch(
            module,
            workload.dataset,
            workload.loss_fn,
            device,
            capacity_bytes=fit.memory_bytes,
            safety_margin=margin,
            limit=limit,
            optimizer=fit.optimizer,
        )
        found[0] = report.max_micro_batch_size
        del module
    dist.broadcast(found, src=0)
    cap = int(found)
    if cap == 0:
        raise ValueError(
            f"not even a micro-batch of 1 fits in {fit.memory_bytes or 'the device memory'} bytes "
            f"with a {margin} safety margin"
        )
    try:
        fitted = replan(spec, cap)
    except PlanError as err:
        raise ValueError(f"the largest micro-batch that fits is {cap}, and then: {err.detail}") from None
    if report is None:
        return fitted, None
    return fitted, MicroBatchSearch(
        fit=report,
        search_limit=limit,
        requested=SearchedSplit(
            tuple(sorted(set(spec.micro_batch_sizes()))), spec.gradient_accumulation_steps
        ),
        planned=ReplannedSplit(
            global_batch_size=fitted.global_batch_size,
            micro_batch_sizes=tuple(sorted(set(fitted.micro_batch_sizes()))),
            gradient_accumulation_steps=fitted.gradient_accumulation_steps,
            max_micro_batch_size=cap,
            plan_request=request_json(fitted.plan_request) if fitted.plan_request else None,
        ),
    )


def default_safety_margin(device: torch.device) -> float:
    """0.1 where the CUDA caching allocator measures the peak; 0.15 on CPU, where counting live
    tensor storage misses what is not tensor storage (convolution kernels' scratch space: 4-7 %
    of the peak against torch.profiler on convolution nets, issue 13)."""
    return 0.1 if device.type == "cuda" else 0.15
