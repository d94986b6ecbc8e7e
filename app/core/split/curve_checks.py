"""The checks a request's throughput curves must pass, each refusal at its field (a JSON pointer
into the request) with what works. The HTTP schema refuses a missing or non-finite number
earlier; the CLI and the rank program, which read JSON without it, meet these."""

from __future__ import annotations

import math

from app.core.errors.domain import InvalidValue, field_key
from app.core.records.plan_request import NodeGroup, Topology
from app.core.records.throughput_curve import ThroughputCurve
from app.core.request.limits import MIN_SAMPLES_PER_S

_MEASURE = "POST /v1/checks with throughput measures one: batchplan measure"


def _pointer(topology: Topology, index: int, name: str) -> str:
    if topology.listed_groups:
        return f"/topology/node_groups/{index}/{name}"
    return f"/topology/{name}"


def validate_curves(topology: Topology, request_cap: int | None) -> None:
    """Every group with a curve or none; each curve strictly increasing in micro-batch, with
    finite positive samples/s, and within its group's cap."""
    groups = topology.node_groups
    with_curve = next((g for g in groups if g.throughput_curve is not None), None)
    if with_curve is None:
        return
    valid: set[ThroughputCurve] = set()  # curves already checked: a cluster of a few GPU kinds repeats them
    for i, group in enumerate(groups):
        if group.throughput_curve is None:
            _refuse_scalar(topology, i, group, with_curve)
        if group.relative_throughput != 1.0:
            raise InvalidValue(
                f"node group {group.name!r} gives both a throughput_curve and relative_throughput "
                f"{group.relative_throughput:g}: with a curve the curve decides the split; leave "
                f"relative_throughput out",
                pointer=_pointer(topology, i, "relative_throughput"),
            )
        curve = group.throughput_curve
        assert curve is not None
        if curve not in valid:
            if not _plainly_valid(curve):
                _check_points(topology, i, group)
            valid.add(curve)
        _check_cap(topology, i, group, curve, request_cap)


def _plainly_valid(curve: ThroughputCurve) -> bool:
    """The usual curve, in a few C-level passes; the field-by-field look names the one at fault."""
    sizes, rates = curve.micro_batch_sizes, curve.samples_per_s
    return (
        0 < len(sizes) == len(rates)
        and set(map(type, sizes)) == _INT
        and sizes[0] >= 1
        and all(map(int.__lt__, sizes, sizes[1:]))
        and set(map(type, rates)) == _FLOAT
        and not any(map(math.isnan, rates))
        and MIN_SAMPLES_PER_S <= min(rates)
        and max(rates) < math.inf
    )


_INT, _FLOAT = {int}, {float}


def _refuse_scalar(topology: Topology, index: int, group: NodeGroup, other: NodeGroup) -> None:
    scalar = group.relative_throughput != 1.0
    field = "relative_throughput" if scalar else "throughput_curve"
    given = f"relative_throughput {group.relative_throughput:g}" if scalar else "no throughput_curve"
    raise InvalidValue(
        f"node group {group.name!r} has {given} while {other.name!r} has a throughput_curve: a "
        f"split is planned from every group's measured curve or from relative_throughput alone, "
        f"never from both. Give {group.name!r} a throughput_curve too ({_MEASURE}), or leave the "
        f"curves out",
        pointer=_pointer(topology, index, field),
    )


def _check_points(topology: Topology, index: int, group: NodeGroup) -> None:
    curve = group.throughput_curve
    assert curve is not None
    base = _pointer(topology, index, "throughput_curve")
    sizes, rates = curve.micro_batch_sizes, curve.samples_per_s
    if not sizes or len(sizes) != len(rates):
        raise InvalidValue(
            "throughput_curve needs at least one point {micro_batch_size, samples_per_s}", pointer=base
        )
    for j, (b, rate) in enumerate(zip(sizes, rates, strict=True)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InvalidValue(
                "a curve point's micro_batch_size must be a whole number >= 1",
                pointer=f"{base}/{j}/micro_batch_size",
            )
        if j and b <= sizes[j - 1]:
            raise InvalidValue(
                f"the curve's micro-batch sizes must strictly increase: point {j} ({b}) is not "
                f"above point {j - 1} ({sizes[j - 1]}); list the points in increasing micro-batch "
                f"order, each size once (sorted: {sorted(set(sizes))})",
                pointer=f"{base}/{j}/micro_batch_size",
            )
        if not (isinstance(rate, float) and math.isfinite(rate) and rate >= MIN_SAMPLES_PER_S):
            raise InvalidValue(
                f"samples_per_s must be a finite number of at least {MIN_SAMPLES_PER_S:g} (a measured "
                f"rate); point {j} has {rate!r}",
                pointer=f"{base}/{j}/samples_per_s",
            )


def _check_cap(
    topology: Topology, index: int, group: NodeGroup, curve: ThroughputCurve, request_cap: int | None
) -> None:
    largest = curve.micro_batch_sizes[-1]
    if (request_cap is None or largest <= request_cap) and (
        group.max_micro_batch_size is None or largest <= group.max_micro_batch_size
    ):
        return
    base = _pointer(topology, index, "throughput_curve")
    caps = [
        (c, p)
        for c, p in (
            (group.max_micro_batch_size, _pointer(topology, index, "max_micro_batch_size")),
            (request_cap, "/max_micro_batch_size"),
        )
        if c is not None
    ]
    cap, cap_pointer = min(caps, key=lambda c: c[0])
    j = next(j for j, b in enumerate(curve.micro_batch_sizes) if b > cap)
    raise InvalidValue(
        f"the curve's point {j} (micro-batch {curve.micro_batch_sizes[j]}) is past the cap of {cap} "
        f"({field_key(cap_pointer)}): a measured micro-batch fits, so the cap is wrong or the point "
        f"is; raise the cap to {largest} or drop the points above {cap}",
        pointer=f"{base}/{j}/micro_batch_size",
        suggestions={field_key(cap_pointer): [largest]},
    )
