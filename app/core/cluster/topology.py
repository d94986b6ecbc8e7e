"""From GPUs to data-parallel replicas, in runs ("segments") rather than one by one.

Ranks are laid out node group by node group, in request order. Data-parallel replica r
owns the model-parallel block of GPUs [r*mp, (r+1)*mp). A block that straddles two node
groups runs at the pace of its slowest GPU and within its smallest cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar, overload

from app.core.errors.domain import InvalidValue, TopologyError, field_key
from app.core.records.plan_request import MAX_WORLD_SIZE, Parallelism, Topology
from app.core.records.record import record
from app.core.records.throughput_curve import StepTime, ThroughputCurve, slowest_of


@record
class Segment:
    """Consecutive replicas [start, stop) with one throughput and one cap."""

    start: int
    stop: int
    node_group: str
    throughput: float
    cap: int | None  # None: no cap
    curve: ThroughputCurve | None = (
        None  # measured samples/s per micro-batch (app.core.records.throughput_curve)
    )

    @property
    def count(self) -> int:
        return self.stop - self.start


T = TypeVar("T")


class cached_property(Generic[T]):  # noqa: N801 (named as the functools one it stands for)
    """functools.cached_property without its lock: Python 3.11's takes an RLock on every first
    read, and every plan reads two of these once (3.12 dropped the lock too). A plan is
    computed on one thread, so a race could only compute the same value twice."""

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__

    @overload
    def __get__(self, instance: None, owner: Any = None) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: Any = None) -> T: ...
    def __get__(self, instance: object, owner: Any = None) -> T | Self:
        if instance is None:  # read on the class: the descriptor itself, as functools' gives
            return self
        # The instance's own __dict__ then answers every later read, before this descriptor.
        value = instance.__dict__[self.name] = self.func(instance)
        return value


@dataclass(frozen=True)  # no slots: the derived properties below are cached per layout
class ReplicaLayout:
    world_size: int
    model_parallel_size: int
    data_parallel_size: int
    segments: tuple[Segment, ...]
    warnings: tuple[str, ...]

    @cached_property
    def heterogeneous(self) -> bool:
        first = self.segments[0]
        here = (first.throughput, first.cap, first.curve)
        return any((s.throughput, s.cap, s.curve) != here for s in self.segments)

    @cached_property
    def uniform_cap(self) -> int | None:
        caps = [s.cap for s in self.segments if s.cap is not None]
        return min(caps) if caps else None

    @cached_property
    def step_times(self) -> list[StepTime | None]:
        """Each segment's predicted micro-step time from its curve (None without one), one
        StepTime per distinct curve: the split pools replicas by it, the plan times its shares."""
        made: dict[ThroughputCurve, StepTime] = {}
        out: list[StepTime | None] = []
        for s in self.segments:
            if s.curve is None:
                out.append(None)
                continue
            time = made.get(s.curve)
            if time is None:
                time = made[s.curve] = StepTime.of(s.curve)
            out.append(time)
        return out

    @cached_property
    def capacity(self) -> int | None:
        """Most samples one micro-step can hold (sum of caps), None when unbounded."""
        if any(s.cap is None for s in self.segments):
            return None
        return sum(s.count * s.cap for s in self.segments if s.cap is not None)


def uniform_layout(replicas: int, model_parallel_size: int, cap: int | None) -> ReplicaLayout:
    """A cluster of identical replicas: what-if layouts for suggestions."""
    segment = Segment(0, replicas, "default", 1.0, cap)
    return ReplicaLayout(replicas * model_parallel_size, model_parallel_size, replicas, (segment,), ())


def _min_cap(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _slower(a: ThroughputCurve | None, b: ThroughputCurve | None) -> ThroughputCurve | None:
    if a is None or b is None or a == b:
        return a if b is None or a == b else b
    return slowest_of(a, b)


def _group_pointer(topology: Topology, index: int, name: str) -> str:
    if topology.listed_groups:
        return f"/topology/node_groups/{index}/{name}"
    return f"/topology/{name}"


def _tensor_warnings(topology: Topology, parallelism: Parallelism) -> list[str]:
    tp = parallelism.tensor
    out = []
    for group in topology.node_groups:
        if tp > 1 and (tp > group.gpus_per_node or group.gpus_per_node % tp):
            where = "" if not topology.listed_groups else f" in node group {group.name!r}"
            out.append(
                f"a tensor-parallel group of {tp} GPUs cannot sit inside one node of "
                f"{group.gpus_per_node} GPUs{where}: its all-reduces will cross the "
                f"inter-node network; use a tensor size that divides {group.gpus_per_node}"
            )
    return out


def _parallel_pointer(world: int, parallelism: Parallelism) -> str:
    """The first parallel size at which the running product stops dividing the world."""
    product = 1
    for name in ("tensor", "pipeline", "context"):
        product *= getattr(parallelism, name)
        if world % product:
            return f"/parallelism/{name}"
    return "/parallelism"


# Over 60 lines: each refusal of a topology names its own field and nearest value, in the order a
# user fixes them.
def resolve_layout(topology: Topology, parallelism: Parallelism, request_cap: int | None) -> ReplicaLayout:
    world = topology.world_size
    mp = parallelism.model_parallel_size
    if world > MAX_WORLD_SIZE:
        per_node = topology.node_groups[0].gpus_per_node
        fits = MAX_WORLD_SIZE // per_node
        raise InvalidValue(
            f"the cluster has {world} GPUs; a plan covers at most {MAX_WORLD_SIZE}",
            pointer="/topology/node_groups" if topology.listed_groups else "/topology/num_nodes",
            suggestions={} if topology.listed_groups or not fits else {"topology.num_nodes": [fits]},
        )
    if world % mp:
        raise TopologyError(
            f"{world} GPUs cannot be split into model-parallel groups of "
            f"tensor {parallelism.tensor} x pipeline {parallelism.pipeline} x context "
            f"{parallelism.context} = {mp} GPUs; the GPU count must be a multiple of {mp}",
            pointer=_parallel_pointer(world, parallelism),
        )

    segments: list[Segment] = []
    # A block of GPUs not yet a whole model-parallel group: name, throughput, cap, curve, GPUs.
    pending: tuple[str, float, int | None, ThroughputCurve | None, int] | None = None
    replica = 0

    def emit(
        name: str, throughput: float, cap: int | None, curve: ThroughputCurve | None, count: int
    ) -> None:
        nonlocal replica
        last = segments[-1] if segments else None
        if (
            last
            and (last.node_group, last.throughput, last.cap) == (name, throughput, cap)
            and last.curve == curve
        ):
            segments[-1] = Segment(last.start, replica + count, name, throughput, cap, curve)
        else:
            segments.append(Segment(replica, replica + count, name, throughput, cap, curve))
        replica += count

    for group in topology.node_groups:
        gpus = group.num_gpus
        cap = _min_cap(request_cap, group.max_micro_batch_size)
        curve = group.throughput_curve
        if pending is not None:
            name, tput, pcap, pcurve, have = pending
            take = min(mp - have, gpus)
            gpus -= take
            pending = (
                f"{name}+{group.name}",
                min(tput, group.relative_throughput),
                _min_cap(pcap, cap),
                _slower(pcurve, curve),
                have + take,
            )
            if pending[4] == mp:
                emit(pending[0], pending[1], pending[2], pending[3], 1)
                pending = None
        if gpus >= mp:
            emit(group.name, group.relative_throughput, cap, curve, gpus // mp)
        if gpus % mp:
            pending = (group.name, group.relative_throughput, cap, curve, gpus % mp)

    warnings = _tensor_warnings(topology, parallelism)
    straddling = [s.node_group for s in segments if "+" in s.node_group]
    if straddling:
        warnings.append(
            "model-parallel groups span node groups ("
            + ", ".join(straddling)
            + "): each such replica runs at the pace of its slowest GPU"
        )
    return ReplicaLayout(world, mp, world // mp, tuple(segments), tuple(warnings))


def validate_topology(topology: Topology) -> None:
    """Checks the core relies on; the HTTP schema enforces the same, earlier."""
    names: set[str] = set()
    for i, group in enumerate(topology.node_groups):
        nodes, gpus = group.num_nodes, group.gpus_per_node
        # Plain ints of at least 1, nearly always: two type tests, then the field-by-field
        # look that names the one at fault.
        if not (type(nodes) is int and nodes >= 1 and type(gpus) is int and gpus >= 1):
            for field_name, value in (("num_nodes", nodes), ("gpus_per_node", gpus)):
                if not isinstance(value, int) or value < 1:
                    pointer = _group_pointer(topology, i, field_name)
                    raise InvalidValue(
                        f"{field_name} must be a whole number >= 1",
                        pointer=pointer,
                        suggestions={field_key(pointer): [1]},
                    )
        if not 0 < group.relative_throughput < math.inf:
            raise InvalidValue(
                "relative_throughput must be finite and > 0",
                pointer=_group_pointer(topology, i, "relative_throughput"),
            )
        if group.name in names:
            raise InvalidValue(
                f"node group name {group.name!r} is used twice; names must be unique",
                pointer=_group_pointer(topology, i, "name"),
            )
        names.add(group.name)
    if not topology.node_groups:
        raise InvalidValue("topology needs at least one node group", pointer="/topology/node_groups")
