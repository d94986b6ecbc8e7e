"""The throughput measurement (issue 38): after the check's step, rank 0 times one data-parallel
replica's micro-step of the check's model at each micro-batch size, and the result gives the
curve in the form `topology.throughput_curve` takes (app.contract.kinds.throughput).

Which ranks measure: rank 0 alone, once the other ranks have finished the check. A curve is one
replica's, and on CPU the warm ranks share the host's cores: ranks timing at once would each
measure a share of the cores, and their points would depend on how many ranks a check had. On a
multi-GPU host the curve is rank 0's GPU's (one GPU type per host is what a node group is).

What is timed (measure/throughput.py): the check's workload (built-in, registered, a
model_factory's, the tokens model) in the check's dtype, not wrapped in DDP, on a batch of
samples 0..b-1 made on the device before the clock starts (a dataset of fewer samples is read
cyclically); a micro-step is a forward and a backward (with `time_optimizer_step`, an AdamW
step too). The all-reduce is not in a point: the planner's micro-step is one replica's compute.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

import torch

from app.contract.check_options import DEFAULT_THROUGHPUT_LIMIT
from app.contract.check_result import CheckResult
from app.contract.kinds.throughput import (
    SPREAD_BOUND,
    SPREAD_IS,
    Throughput,
    ThroughputPoint,
    default_sizes,
    plan_cap,
)
from app.contract.spec import CheckSpec
from app.worker.checks.kind import AfterKind, Context, Laps
from app.worker.checks.run.check import run_workload
from app.worker.measure.throughput import time_sizes
from app.worker.training.token_model import TokenWorkload
from app.worker.training.workload import Workload


def _significant(value: float) -> float:
    return float(f"{value:.6g}")


@dataclass
class _Measured:
    throughput: Throughput | None = None


class ThroughputMeasure(AfterKind[_Measured]):
    """After the check: rank 0's curve of one replica's micro-step over the asked sizes."""

    name: ClassVar[str] = "throughput"
    # Only rank 0 measures, in the reference phase, after the others have left the check.
    laps: ClassVar[Laps] = Laps(plan="throughput", controls=None, reference="throughput")

    def applies(self, spec: CheckSpec) -> bool:
        return spec.throughput is not None

    def prepare(self, ctx: Context) -> _Measured:
        return _Measured()

    def reference(self, ctx: Context, state: _Measured) -> None:
        state.throughput = measure_throughput(ctx)

    def result(self, ctx: Context, state: _Measured, prior: CheckResult | None) -> CheckResult:
        assert prior is not None and state.throughput is not None
        return dataclasses.replace(prior, throughput=state.throughput)


def _sizes(spec: CheckSpec) -> tuple[int, ...]:
    """The asked sizes; after a micro-batch search without them, powers of two up to what fit
    (the cap the search re-planned under)."""
    asked = spec.throughput
    assert asked is not None
    if asked.micro_batch_sizes is not None:
        return asked.micro_batch_sizes
    cap = plan_cap(spec.plan_request) if spec.plan_request is not None else None
    return default_sizes(cap or DEFAULT_THROUGHPUT_LIMIT)


def _sequence_length(spec: CheckSpec, work: Workload) -> int | None:
    if isinstance(work, TokenWorkload):
        return work.data_sequence_length
    return spec.sequence_length


# Over 60 lines: one timed loop's setup, its points and the record it fills, in the order the
# result lists them.
def measure_throughput(ctx: Context) -> Throughput:
    """Rank 0's points, smallest micro-batch first; the first size that runs out of device
    memory ends the curve there."""
    asked, spec, device = ctx.spec.throughput, ctx.spec, ctx.device
    assert asked is not None
    started = time.perf_counter()
    work = run_workload(spec, ctx.workload)
    module = work.single_process_module(ctx.dtype, device)
    size_of = work.dataset_size

    def batch(b: int) -> tuple[Any, Any]:
        indices = [i % size_of for i in range(b)] if size_of else list(range(b))
        return work.batch(indices, ctx.dtype, device)

    def loss(m: torch.nn.Module, x: Any, y: Any) -> torch.Tensor:
        return work.loss(m, x, y, "mean")

    length = _sequence_length(spec, work)
    sizes = _sizes(spec)
    timed, out_of_memory = time_sizes(
        module,
        loss,
        batch,
        sizes,
        device,
        repeats=asked.repeats,
        warmup=asked.warmup_steps,
        optimizer=asked.time_optimizer_step,
        spread_bound=SPREAD_BOUND,
    )
    points: list[ThroughputPoint] = []
    for b, t in timed.items():
        rate = _significant(b / t.median)
        points.append(
            ThroughputPoint(
                micro_batch_size=b,
                step_time_s=_significant(t.median),
                spread=_significant(t.spread),
                samples_per_s=rate,
                tokens_per_s=None if length is None else _significant(rate * length),
                peak_memory_bytes=t.peak_memory_bytes,
                micro_steps_per_repeat=t.per_repeat,
                repeats=len(t.times),
                noisy=t.spread > SPREAD_BOUND,
            )
        )
    if not points:
        raise ValueError(
            f"micro-batch {out_of_memory} ran out of device memory, the smallest asked for: measure "
            "smaller micro_batch_sizes (fit_micro_batch finds the largest that fits)"
        )
    return Throughput(
        points=tuple(points),
        margin=asked.margin,
        repeats=asked.repeats,
        warmup_steps=asked.warmup_steps,
        time_optimizer_step=asked.time_optimizer_step,
        spread_is=SPREAD_IS,
        device=str(device),
        threads=torch.get_num_threads(),
        measured_by="rank 0 alone, after the check (the other ranks idle)",
        out_of_memory_at=out_of_memory,
        seconds=round(time.perf_counter() - started, 3),
        spread_bound=SPREAD_BOUND,
        warnings=noise_warnings(points, asked.repeats),
    )


def noise_warnings(points: list[ThroughputPoint], repeats: int) -> tuple[str, ...]:
    """What a reader must know before using the curve: points whose repeats still disagree
    after remeasuring, and a step that got faster at a larger micro-batch (beyond the bound:
    more samples cannot take less compute, so the host's load moved one of them)."""
    out: list[str] = []
    noisy = [p for p in points if p.noisy]
    if noisy:
        listed = ", ".join(f"{p.micro_batch_size} ({p.spread:.0%})" for p in noisy)
        out.append(
            f"noisy: the repeats of micro-batch {listed} spread more than {SPREAD_BOUND:.0%} even after "
            f"remeasuring; measure on an idle host, or with more repeats (throughput.repeats, now {repeats})"
        )
    for smaller, larger in pairwise(points):
        if larger.step_time_s < smaller.step_time_s * (1 - SPREAD_BOUND):
            out.append(
                f"micro-batch {larger.micro_batch_size}'s step ({larger.step_time_s:.4g} s) took less than "
                f"micro-batch {smaller.micro_batch_size}'s ({smaller.step_time_s:.4g} s): the host's load "
                "moved one of them; measure again on an idle host before planning from this curve"
            )
    return tuple(out)
