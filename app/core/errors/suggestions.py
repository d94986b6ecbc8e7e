"""Suggestions keyed by the request field they change, each one tried before it is given.

A suggestion's key is the field's path in the plan request, its parts joined by dots:
`global_batch_size`, `parallelism.tensor`, `topology.num_nodes`,
`topology.node_groups.0.num_nodes` (`field_key` turns an error's pointer into it). The batch
arithmetic knows data-parallel sizes and GPU counts that would work, which no request has as a
field: here they become the fields it does have (the GPU counts under `topology`, the parallel
sizes under `parallelism`). Every value outside the batch fields, which app.core.split.batch and
app.core.tokens.token_plan check as they make them, is substituted into the request and tried; only the
values that work are given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from app.core.errors.domain import DomainError, TopologyError
from app.core.records.plan_request import MAX_WORLD_SIZE, PlanRequest, Topology

# Tried where they are made (app.core.split.batch's feasibility, app.core.tokens.token_plan' planning).
CHECKED_WHERE_MADE = frozenset(
    {
        "global_batch_size",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "global_batch_tokens",
        "micro_batch_tokens",
    }
)
PARALLEL_SIZES = ("tensor", "pipeline", "context")
MOST = 2  # values each side of the request's, per field
SCAN = 256  # how far from the request's value a search looks
# Requests tried for GPU counts and parallel sizes, per field and per error: a bound on what
# an error costs to answer (on a cluster of 10,000 node groups a plan takes tens of ms).
TRIES_PER_FIELD = 6
TRIES = 24
TRIES_ON_LARGE_CLUSTERS = 2  # more than LARGE node groups, where a plan takes tens of ms
LARGE = 100
# Node groups whose GPU counts are searched on a large cluster. The tries bound the plans an
# error makes, not the values scanned before one: where few values pass the cheap test, a
# search of every group scanned 512 values per field of each (10,000 groups: 3.7 s, against
# 0.45 s for the cluster's plan). The first groups' counts are the suggestions anyway.
GROUPS_SEARCHED_ON_LARGE_CLUSTERS = 8

Works = Callable[[PlanRequest], bool]
T = TypeVar("T")


def substitute(request: T, key: str, value: int) -> T | None:
    """`request` (a plan request, or another request dataclass) with the field at `key` set to
    `value`; None where it has no such field."""
    try:
        out = _replace(request, key.split("."), value)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    return out if type(out) is type(request) else None


def _replace(node: Any, parts: list[str], value: int) -> Any:
    head, rest = parts[0], parts[1:]
    if isinstance(node, Topology) and not node.listed_groups and head in ("num_nodes", "gpus_per_node"):
        if rest:
            raise ValueError(head)
        # A homogeneous topology is one node group; its fields are the request's.
        group = node.node_groups[0]
        if head == "num_nodes":
            group = dataclasses.replace(group, num_nodes=value)
        else:
            group = dataclasses.replace(group, gpus_per_node=value)
        return dataclasses.replace(node, node_groups=(group,))
    if isinstance(node, tuple):
        items = list(node)
        items[int(head)] = _replace(items[int(head)], rest, value)
        return tuple(items)
    if not dataclasses.is_dataclass(node) or head not in {f.name for f in dataclasses.fields(node)}:
        raise AttributeError(head)
    inner = value if not rest else _replace(getattr(node, head), rest, value)
    return dataclasses.replace(node, **{head: inner})  # type: ignore[type-var]


def _nearest(current: int, ok: Callable[[int], bool], high: int) -> list[int]:
    """Up to MOST values below and above `current` for which `ok` holds, nearest first."""
    below: list[int] = []
    above: list[int] = []
    for step in range(1, SCAN + 1):
        if len(below) < MOST and current - step >= 1 and ok(current - step):
            below.append(current - step)
        if len(above) < MOST and current + step <= high and ok(current + step):
            above.append(current + step)
        if len(below) == len(above) == MOST:
            break
    return sorted(below + above, key=lambda v: (abs(v - current), v))


def nearest_working(request: T, key: str, high: int, works: Callable[[T], bool], tries: int) -> list[int]:
    """Values of the whole-number field at `key` near the request's own that work when
    substituted alone, trying at most `tries` of them."""
    current = _value(request, key.split("."))
    left = tries

    def ok(value: int) -> bool:
        nonlocal left
        changed = substitute(request, key, value)
        if changed is None or left <= 0:
            return False
        left -= 1
        return works(changed)

    return _nearest(current, ok, high)


def _value(node: Any, parts: list[str]) -> int:
    for part in parts:
        node = node[int(part)] if isinstance(node, tuple) else getattr(node, part)
    return int(node)


class _Budget:
    """Counts the requests tried, so that a huge cluster's error stays cheap to answer."""

    def __init__(self, works: Works, request: PlanRequest) -> None:
        large = len(request.topology.node_groups) > LARGE
        self.works, self.left = works, TRIES_ON_LARGE_CLUSTERS if large else TRIES

    def __call__(self, request: PlanRequest | None) -> bool:
        if request is None or self.left <= 0:
            return False
        self.left -= 1
        return self.works(request)


def _search(
    request: PlanRequest, key: str, current: int, high: int, admits: Callable[[int], bool], budget: _Budget
) -> list[int]:
    """Values of the field at `key` near `current` that `admits` (a cheap test) and that work,
    within TRIES_PER_FIELD of the error's budget."""
    tries = TRIES_PER_FIELD

    def ok(value: int) -> bool:
        nonlocal tries
        if not admits(value) or tries <= 0:
            return False
        tries -= 1
        return budget(substitute(request, key, value))

    return _nearest(current, ok, high)


def gpu_suggestions(
    request: PlanRequest, worlds: Callable[[int], bool], budget: _Budget
) -> dict[str, list[int]]:
    """GPU counts under `topology` whose world size `worlds` admits and that work: the nodes
    or GPUs per node of the request, or of one node group (the first ones, within TRIES)."""
    topology, world = request.topology, request.topology.world_size
    out: dict[str, list[int]] = {}
    prefix = "topology" if not topology.listed_groups else "topology.node_groups.{i}"
    groups = topology.node_groups
    if len(groups) > LARGE:
        groups = groups[:GROUPS_SEARCHED_ON_LARGE_CLUSTERS]
    for i, group in enumerate(groups):
        rest = world - group.num_gpus  # the other groups' GPUs
        for name, other in (("num_nodes", group.gpus_per_node), ("gpus_per_node", group.num_nodes)):

            def admits(value: int, rest: int = rest, other: int = other) -> bool:
                return worlds(rest + value * other)

            key = f"{prefix.format(i=i)}.{name}"
            high = max((MAX_WORLD_SIZE - rest) // other, 1)
            found = _search(request, key, getattr(group, name), high, admits, budget)
            if found:
                out[key] = found
        if budget.left <= 0:
            break
    return out


def parallel_suggestions(request: PlanRequest, budget: _Budget) -> dict[str, list[int]]:
    """Tensor, pipeline and context sizes that divide the GPUs, each changed alone, that work."""
    world, p = request.topology.world_size, request.parallelism
    out = {}
    for name in PARALLEL_SIZES:
        others = p.model_parallel_size // getattr(p, name)

        def admits(value: int, others: int = others) -> bool:
            return world % (others * value) == 0

        key = f"parallelism.{name}"
        found = _search(request, key, getattr(p, name), max(world // others, 1), admits, budget)
        if found:
            out[key] = found
    return out


def with_request_fields(
    request: PlanRequest, err: DomainError, works: Works, trusted: frozenset[str] = CHECKED_WHERE_MADE
) -> DomainError:
    """`err` with suggestions that name request fields: GPU counts and parallel sizes where it
    had data-parallel sizes (or where the parallel sizes do not divide the GPUs), and only the
    values that work. The `trusted` fields were tried where they were made."""
    suggestions = dict(err.suggestions)
    sizes = suggestions.pop("data_parallel_size", [])
    tried: dict[str, list[int]] = {}
    mp = request.parallelism.model_parallel_size
    if sizes:
        holding = {d * mp for d in sizes}
        tried = gpu_suggestions(request, lambda w: w in holding, _Budget(works, request))
    elif isinstance(err, TopologyError) and request.topology.world_size % mp:
        tried = {
            **parallel_suggestions(request, budget := _Budget(works, request)),
            **gpu_suggestions(request, lambda w: w % mp == 0, budget),
        }
    kept = keep_working(request, dataclasses.replace(err, suggestions=suggestions), works, trusted)
    return dataclasses.replace(kept, suggestions={**kept.suggestions, **tried})


def keep_working(
    request: T, err: DomainError, works: Callable[[T], bool], trusted: frozenset[str] = frozenset()
) -> DomainError:
    """`err` with only the suggestions that work when substituted into `request`, alone or,
    for a combined suggestion, together (the `trusted` fields were tried where they were made)."""
    checked = {}
    for key, values in err.suggestions.items():
        if key in trusted:
            checked[key] = values
        else:
            checked[key] = [v for v in values if (changed := substitute(request, key, v)) and works(changed)]
    combined = [
        change
        for change in err.combined_suggestions
        if set(change) <= trusted or _works_with(request, change, works)
    ]
    return dataclasses.replace(
        err, suggestions={k: v for k, v in checked.items() if v}, combined_suggestions=combined
    )


def _works_with(request: T, change: dict[str, int], works: Callable[[T], bool]) -> bool:
    changed: T | None = request
    for key, value in change.items():
        changed = substitute(changed, key, value) if changed is not None else None
    return changed is not None and works(changed)
