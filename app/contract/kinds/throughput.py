"""A check's throughput measurement, the contract half: the options (`ThroughputOptions`) held
against the plan where the request comes in (`throughput_options`: what every entry refuses,
at the field, saying what works), and the result a rank returns (`Throughput`: each point, the
fastest and the knee, and `curve`, the list `topology.throughput_curve` takes as it is).

The measurement itself is `app.worker.checks.throughput_check` (rank 0 times one replica's
micro-step) over `app.worker.measure.throughput` (the timed loop).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from app.contract.check_options import (
    DEFAULT_KNEE_MARGIN,
    DEFAULT_THROUGHPUT_LIMIT,
    DEFAULT_THROUGHPUT_REPEATS,
    DEFAULT_THROUGHPUT_WARMUP,
    MAX_THROUGHPUT_POINTS,
)
from app.contract.kinds.part import RequestPart, Trained
from app.contract.limits import within
from app.contract.spec_error import SpecError
from app.core.errors.domain import InvalidValue
from app.core.records.plan_request import PlanRequest

if TYPE_CHECKING:
    from app.contract.request import CheckRequest
    from app.contract.spec import CheckSpec

SPREAD_IS = "interquartile range / median of the repeats' step times"
# A point whose repeats spread more is remeasured, then flagged `noisy` (two curves agree
# within about this much at every point when none is).
SPREAD_BOUND = 0.05


@dataclass(frozen=True, slots=True)
class ThroughputOptions:
    """Measure one replica's micro-step at each of `micro_batch_sizes` (None: powers of two up
    to the plan's cap, `default_sizes`): `warmup_steps` untimed, then the median of `repeats`;
    with `time_optimizer_step`, each timed step includes an optimizer step. The knee is the
    smallest micro-batch within `margin` of the fastest samples/s."""

    micro_batch_sizes: tuple[int, ...] | None = None
    repeats: int = DEFAULT_THROUGHPUT_REPEATS
    warmup_steps: int = DEFAULT_THROUGHPUT_WARMUP
    time_optimizer_step: bool = False
    margin: float = DEFAULT_KNEE_MARGIN


class ThroughputPart(RequestPart):
    """`throughput`: the measurement every rank's spec carries (`CheckSpec.throughput`), its
    sizes filled in; on one data-parallel replica, so not with a device mesh."""

    option: ClassVar[str] = "throughput"

    def apply(self, request: CheckRequest, trained: Trained, spec: CheckSpec) -> CheckSpec:
        asked = request.options.throughput
        if asked is None:
            return spec
        if spec.mesh is not None:
            raise SpecError(
                "throughput is measured on one data-parallel replica: drop throughput with a device mesh, "
                "or measure with tensor, pipeline and context 1 and data_parallel_shard 1",
                "/throughput",
            )
        searched = request.options.fit_micro_batch is not None
        return replace(spec, throughput=throughput_options(asked, request.plan, searched=searched))

    def replanned(self, spec: CheckSpec, fresh: CheckSpec) -> CheckSpec:
        # Measured on the re-planned split, up to the micro-batch the search found.
        return replace(fresh, throughput=spec.throughput)


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """One micro-batch size, measured: the median micro-step over the repeats."""

    micro_batch_size: int
    step_time_s: float  # the median of the repeats
    spread: float  # SPREAD_IS
    samples_per_s: float
    tokens_per_s: float | None  # token plans: samples/s x sequence_length; else None
    peak_memory_bytes: int | None  # the device's allocator peak (CUDA); None on CPU
    micro_steps_per_repeat: int  # micro-steps each repeat timed (together >= 10 ms: a clock's noise)
    repeats: int  # the repeats its median is over (more than asked where it was remeasured)
    noisy: bool  # its spread is above the bound even after remeasuring


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """A point as `topology.throughput_curve` and `node_groups[].throughput_curve` take it."""

    micro_batch_size: int
    samples_per_s: float


@dataclass(frozen=True, slots=True)
class Throughput:
    """The measured curve of one replica on rank 0's device; the fastest, the knee and the curve
    are derived from the points, so they cannot disagree with them."""

    points: tuple[ThroughputPoint, ...]  # by micro_batch_size, ascending
    margin: float  # the knee: the smallest micro-batch within this fraction of the fastest samples/s
    repeats: int
    warmup_steps: int
    time_optimizer_step: bool
    spread_is: str
    device: str
    threads: int  # torch's intra-op threads on rank 0 (CPU: what a point had)
    measured_by: str  # which rank, alone or not
    # The first micro-batch that ran out of device memory (the larger ones were not measured).
    out_of_memory_at: int | None
    seconds: float
    spread_bound: float  # SPREAD_BOUND
    warnings: tuple[str, ...]  # noisy points, a step faster at a larger micro-batch: what to do

    derived: ClassVar[tuple[str, ...]] = ("fastest_micro_batch_size", "knee_micro_batch_size", "curve")

    @property
    def fastest_micro_batch_size(self) -> int:
        """The micro-batch with the most samples/s (the smaller on a tie)."""
        best = max(p.samples_per_s for p in self.points)
        return next(p.micro_batch_size for p in self.points if p.samples_per_s == best)

    @property
    def knee_micro_batch_size(self) -> int:
        """The smallest micro-batch within `margin` of the fastest samples/s."""
        floor = (1 - self.margin) * max(p.samples_per_s for p in self.points)
        return next(p.micro_batch_size for p in self.points if p.samples_per_s >= floor)

    @property
    def curve(self) -> tuple[CurvePoint, ...]:
        return tuple(CurvePoint(p.micro_batch_size, p.samples_per_s) for p in self.points)


def plan_cap(plan: PlanRequest) -> int | None:
    """The largest micro-batch the plan allows a replica: the request's max_micro_batch_size,
    else (every group capped) the largest group's cap; None: uncapped."""
    if plan.max_micro_batch_size is not None:
        return plan.max_micro_batch_size
    caps = [g.max_micro_batch_size for g in plan.topology.node_groups]
    return max(c for c in caps if c is not None) if caps and None not in caps else None


def default_sizes(limit: int) -> tuple[int, ...]:
    """Powers of two up to `limit`, and `limit` itself when it is not one."""
    sizes: list[int] = []
    b = 1
    while b <= limit and len(sizes) < MAX_THROUGHPUT_POINTS - 1:
        sizes.append(b)
        b *= 2
    return tuple(sizes if sizes[-1] == limit else [*sizes, limit])


def throughput_options(asked: ThroughputOptions, plan: PlanRequest, *, searched: bool) -> ThroughputOptions:
    """The measurement to run: `asked` checked against the plan (each refusal a 422 at its field,
    saying what works), with its default sizes filled in. `searched`: the micro-batch search
    runs first, and without sizes the measurement goes up to what it finds (sizes stay None)."""
    within(asked, "throughput")
    cap = plan_cap(plan)
    sizes = asked.micro_batch_sizes
    if sizes is None:
        return (
            asked
            if searched
            else replace(asked, micro_batch_sizes=default_sizes(cap or DEFAULT_THROUGHPUT_LIMIT))
        )
    pointer = "/throughput/micro_batch_sizes"
    ordered = sorted(set(sizes))
    for i, b in enumerate(sizes):
        if i and b <= sizes[i - 1]:
            raise InvalidValue(
                f"micro_batch_sizes must strictly increase ({b} follows {sizes[i - 1]}): give each size "
                f"once, in increasing order, e.g. {ordered}",
                pointer=f"{pointer}/{i}",
            )
        if cap is not None and b > cap:
            raise InvalidValue(
                f"micro-batch {b} is past the plan's cap of {cap} (max_micro_batch_size): measure sizes up "
                f"to {cap}, or raise the plan's max_micro_batch_size to {sizes[-1]}",
                pointer=f"{pointer}/{i}",
            )
    return asked
