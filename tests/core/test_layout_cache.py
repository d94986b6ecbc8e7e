"""ReplicaLayout's derived values (heterogeneous, uniform_cap, capacity) are cached per layout by
app.core.cluster.topology's lock-free cached_property: the same values as functools.cached_property
gives over the same functions, each computed once per layout, and the layout stays frozen."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from app.core.cluster import topology
from app.core.cluster.topology import ReplicaLayout, resolve_layout
from app.core.records.plan_request import NodeGroup, Parallelism, Topology

DERIVED = ("heterogeneous", "uniform_cap", "capacity")

TOPOLOGIES = {
    "homogeneous": Topology.homogeneous(4, 8),
    "mixed, capped": Topology(
        (NodeGroup("h100", 2, 8, 2.0, 64), NodeGroup("a100", 1, 4, 1.0, 32)), listed_groups=True
    ),
    "mixed, one uncapped": Topology(
        (NodeGroup("h100", 2, 8, 2.5, None), NodeGroup("a100", 3, 4, 1.0, 16)), listed_groups=True
    ),
}


def _layouts() -> list[ReplicaLayout]:
    return [
        resolve_layout(t, Parallelism(tensor=tp), cap)
        for t in TOPOLOGIES.values()
        for tp in (1, 2)
        for cap in (None, 48)
    ]


def test_the_values_are_functools_cached_propertys() -> None:
    reference = type(
        "Reference",
        (),
        {name: functools.cached_property(getattr(ReplicaLayout, name).func) for name in DERIVED},
    )
    for layout in _layouts():
        twin = reference()
        twin.segments = layout.segments
        for name in DERIVED:
            assert getattr(layout, name) == getattr(twin, name), (name, layout)


def test_each_value_is_computed_once_per_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    for name in DERIVED:
        descriptor = getattr(ReplicaLayout, name)
        original = descriptor.func

        def counted(layout: ReplicaLayout, name: str = name, original: object = original) -> object:
            calls.append((name, id(layout)))
            return original(layout)  # type: ignore[operator]

        monkeypatch.setattr(descriptor, "func", counted)
    first, second = _layouts()[2:4]
    for _ in range(3):
        for name in DERIVED:
            getattr(first, name)
    assert sorted(calls) == sorted((name, id(first)) for name in DERIVED)
    for name in DERIVED:
        getattr(second, name)
    assert len(calls) == 2 * len(DERIVED)


def test_a_layout_stays_frozen_after_a_cached_read() -> None:
    layout = _layouts()[0]
    assert layout.heterogeneous is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.heterogeneous = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.world_size = 1  # type: ignore[misc]
    assert topology.cached_property is not functools.cached_property
