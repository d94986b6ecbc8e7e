"""A refusal of a large cluster costs about what a plan of it does (issue 40, speed): the GPU-count
suggestions searched every node group's fields, up to 256 values each side, whenever few of
those values passed the cheap test (a micro-batch of 3 on 10,000 node groups took 3.7 s, against
0.45 s for the plan). The search looks at a bounded number of node groups, so the work of an
error no longer grows with the cluster; bench/README.md has the timings
(bench/bench_refusals.py)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from app.core.errors import suggestions as field_suggestions
from app.core.errors.domain import PlanError
from app.core.errors.suggestions import _Budget, gpu_suggestions
from app.core.planner import plan
from app.core.records.plan_request import NodeGroup, PlanRequest, Topology


def _cluster(n: int) -> Topology:
    rng = random.Random(n)
    groups = tuple(
        NodeGroup(
            name=f"g{i}",
            num_nodes=rng.randint(1, 8),
            gpus_per_node=rng.choice((1, 2, 4, 8)),
            relative_throughput=rng.choice((0.5, 1.0, 2.0)),
        )
        for i in range(n)
    )
    return Topology(node_groups=groups, listed_groups=True)


def _counting(test: Callable[[int], bool]) -> tuple[Callable[[int], bool], list[int]]:
    seen: list[int] = []

    def counted(world: int) -> bool:
        seen.append(world)
        return test(world)

    return counted, seen


@pytest.mark.parametrize("groups", [200, 2_000])
def test_the_gpu_search_of_an_error_does_not_grow_with_the_node_groups(groups: int) -> None:
    """Worlds no value reaches (the worst case: nothing is ever tried, so no budget is spent)."""
    small, large = _cluster(groups), _cluster(groups * 5)
    counts = []
    for topology in (small, large):
        request = PlanRequest(topology=topology, global_batch_size=topology.world_size)
        worlds, seen = _counting(lambda w: False)
        assert gpu_suggestions(request, worlds, _Budget(lambda r: True, request)) == {}
        counts.append(len(seen))
    # Each searched group's two fields scan at most SCAN values each side, whatever the cluster.
    bound = field_suggestions.GROUPS_SEARCHED_ON_LARGE_CLUSTERS * 2 * 2 * field_suggestions.SCAN
    assert 0 < counts[0] <= bound and 0 < counts[1] <= bound


def test_a_large_refusal_still_suggests_values_that_work() -> None:
    topology = _cluster(1_000)
    request = PlanRequest(
        topology=topology, global_batch_size=topology.world_size * 8 + 1, micro_batch_size=3
    )
    with pytest.raises(PlanError) as refused:
        plan(request)
    suggestions = refused.value.suggestions
    assert suggestions
    for key, values in suggestions.items():
        for value in values:
            changed = field_suggestions.substitute(request, key, value)
            assert changed is not None
            plan(changed)  # each suggestion, substituted alone, plans


def test_a_schema_error_tries_its_suggestion_without_copying_the_whole_request() -> None:
    """The tried request shares every object off the error's path with the request sent (a deep
    copy of 10,000 node groups cost more than validating them), and the request sent is left
    as it was."""
    from app.schemas.checked_suggestions import _path, _replaced

    groups = [{"num_nodes": 1, "gpus_per_node": 8} for _ in range(3)]
    data = {"topology": {"node_groups": groups}, "global_batch_size": 64}
    loc = ("topology", "node_groups", 2, "num_nodes")
    tried = _replaced(data, _path(data, loc), 4)
    assert tried["topology"]["node_groups"][2]["num_nodes"] == 4
    assert data["topology"]["node_groups"][2]["num_nodes"] == 1
    assert (
        tried["topology"]["node_groups"][0] is groups[0] and tried["topology"]["node_groups"][1] is groups[1]
    )
    assert _replaced(data, _path(data, ("nowhere",)), 4) is None
