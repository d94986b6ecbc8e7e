"""The plan's device mesh held to torchtitan's own ParallelDims (torchtitan 0.2.2, the release
the torchtitan export writes for and pyproject pins), on 2,000 seeded random layouts:
what ParallelDims refuses to build the plan refuses (each suggestion then builds), and for what
it builds the plan's dimensions, sizes, data-parallel group, expert size and wrapper are
torchtitan's (parallel_dims_probe.py builds each on a fake process group).

The wrapper is the one torchtitan's parallelize functions apply (models/llama3/infra/
parallelize.py): FSDP over the `fsdp` mesh, dp_shard x cp, whenever `fsdp_enabled` (dp_shard > 1
or cp > 1), as HSDP when dp_replicate > 1 too; else DDP over dp_replicate. A plan without any
data parallelism (one replica, no context) says ddp where torchtitan applies no wrapper: DDP of
one rank is the identity.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.core.cluster.device_mesh import ORDER
from app.core.errors.domain import InvalidValue
from app.core.planner import plan
from app.core.records.plan_request import Parallelism, PlanRequest, Topology

pytestmark = [
    pytest.mark.slow,  # the probe builds 1,300-odd distinct layouts: 15-30 s on 2 cores
    # ... and ten times that on two loaded cores: as long as the probe's own limit.
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed (consumers group)"
    ),
]

PROBE = Path(__file__).with_name("parallel_dims_probe.py")
SEED, LAYOUTS = 40, 2000


def _layouts() -> list[dict[str, int]]:
    """tp, pp, cp and the data-parallel size drawn from small sizes, data_parallel_shard from
    the data-parallel size's divisors mostly (a non-divisor now and then), expert from 1 to 16."""
    rng = random.Random(SEED)
    out = []
    for _ in range(LAYOUTS):
        tp, pp, dp = (rng.choice([1, 1, 2, 3, 4, 8]) for _ in range(3))
        cp = rng.choice([1, 1, 2, 4])
        divisors = [d for d in range(1, dp + 1) if dp % d == 0]
        shard = rng.choice(divisors) if rng.random() < 0.9 else rng.randint(1, 8)
        expert = rng.choice([1, 1, rng.randint(1, 16)])
        out.append({"tp": tp, "pp": pp, "cp": cp, "dp": dp, "shard": shard, "expert": expert})
    return out


def _titan(layout: dict[str, int], shard: int, expert: int) -> dict[str, int]:
    dp = layout["dp"]
    return {
        "world": layout["tp"] * layout["pp"] * layout["cp"] * dp,
        # A shard that does not divide the data-parallel size has no whole replicate degree;
        # ParallelDims then sees degrees whose product is not the world size, and refuses.
        "dp_replicate": max(dp // shard, 1),
        "dp_shard": shard,
        "cp": layout["cp"],
        "tp": layout["tp"],
        "pp": layout["pp"],
        "ep": expert,
    }


def _parallelism(layout: dict[str, int], shard: int, expert: int) -> Parallelism:
    return Parallelism(
        tensor=layout["tp"],
        pipeline=layout["pp"],
        context=layout["cp"],
        data_parallel_shard=shard,
        expert=expert,
    )


def _request(layout: dict[str, int], shard: int, expert: int) -> PlanRequest:
    world = layout["tp"] * layout["pp"] * layout["cp"] * layout["dp"]
    return PlanRequest(
        topology=Topology.homogeneous(1, world),
        global_batch_size=None,
        micro_batch_size=1,
        parallelism=_parallelism(layout, shard, expert),
    )


def _probe(layouts: list[dict[str, int]]) -> list[dict[str, Any]]:
    """torchtitan's answer for each layout, each distinct one built once (the random draw repeats
    about a third of its layouts; a build is ParallelDims' own, so the same layout answers the same)."""
    distinct = list({json.dumps(layout, sort_keys=True): layout for layout in layouts}.values())
    answers = dict(zip((json.dumps(d, sort_keys=True) for d in distinct), _probe_once(distinct), strict=True))
    return [answers[json.dumps(layout, sort_keys=True)] for layout in layouts]


def _probe_once(layouts: list[dict[str, int]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(PROBE)],
        check=False,
        input=json.dumps(layouts),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    return list(json.loads(lines[-1].removeprefix("RESULT ")))


def _wrapper(titan: dict[str, Any]) -> str:
    if titan["fsdp_enabled"]:
        return "hsdp" if titan["dp_replicate_enabled"] else "fsdp"
    return "ddp"


def _holds(planned: Any, titan: dict[str, Any]) -> None:
    mesh = planned.device_mesh
    degrees, sizes = titan["degrees"], titan["sizes"]
    expected = [(name, degrees[name]) for name in ORDER if degrees[name] > 1] or [("dp_replicate", 1)]
    assert [(d.name, d.size) for d in mesh.dimensions] == expected
    # Every dimension the plan names is one of torchtitan's enabled meshes (dp_shard: its share
    # of the fsdp mesh, which also holds cp), of the same size.
    for name, size in expected:
        if name != "dp_shard" and size > 1:
            assert name in titan["enabled"] and sizes[name] == size, (name, titan)
    assert planned.data_parallel_size == sizes["batch"]
    assert mesh.data_parallel_replicate == sizes["dp_replicate"]
    assert mesh.data_parallel_shard * degrees["cp"] == sizes["fsdp"]
    assert mesh.data_parallel_dimensions == tuple(n for n, _ in expected if n in ("dp_replicate", "dp_shard"))
    assert mesh.expert == sizes["ep"]
    assert mesh.wrapper == _wrapper(titan), titan


# Two layouts the issue named: torchtitan's expert parallel across tensor ranks (1 x 8 GPUs,
# tensor 4, expert 2: efsdp 2 x ep 2), refused under 0.2.0's etp=1 rule (a multiple of context x
# tensor); and context parallel with data_parallel_shard 1 on 4 replicas, and on one.
EXPERT_ACROSS_TENSOR = {"tp": 4, "pp": 1, "cp": 1, "dp": 2, "shard": 1, "expert": 2}
CONTEXT_ON_REPLICAS = {"tp": 1, "pp": 1, "cp": 2, "dp": 4, "shard": 1, "expert": 1}
CONTEXT_ALONE = {**CONTEXT_ON_REPLICAS, "dp": 1}


@pytest.fixture(scope="module")
def layouts() -> list[dict[str, int]]:
    return [EXPERT_ACROSS_TENSOR, CONTEXT_ON_REPLICAS, CONTEXT_ALONE, *_layouts()]


@pytest.fixture(scope="module")
def planned(layouts: list[dict[str, int]]) -> list[Any]:
    """Each layout's plan, or the plan's refusal."""
    out: list[Any] = []
    for layout in layouts:
        try:
            out.append(plan(_request(layout, layout["shard"], layout["expert"])))
        except InvalidValue as err:
            out.append(err)
    return out


@pytest.fixture(scope="module")
def suggested(layouts: list[dict[str, int]], planned: list[Any]) -> list[dict[str, int]]:
    """Each refusal's suggestions, as layouts."""
    out = []
    for layout, ours in zip(layouts, planned, strict=True):
        for key, values in ours.suggestions.items() if isinstance(ours, InvalidValue) else ():
            field = {"parallelism.data_parallel_shard": "shard", "parallelism.expert": "expert"}[key]
            out += [{**layout, field: v} for v in values]
    return out


@pytest.fixture(scope="module")
def titan(layouts: list[dict[str, int]], suggested: list[dict[str, int]]) -> list[dict[str, Any]]:
    """torchtitan's answer for every layout, then for every suggestion: one probe process."""
    return _probe([_titan(layout, layout["shard"], layout["expert"]) for layout in [*layouts, *suggested]])


def test_the_plans_mesh_is_torchtitans_parallel_dims_on_random_layouts(
    layouts: list[dict[str, int]], planned: list[Any], titan: list[dict[str, Any]]
) -> None:
    disagree = []
    for layout, ours, theirs in zip(layouts, planned, titan, strict=False):
        if isinstance(ours, InvalidValue):
            if "error" not in theirs:
                disagree.append((layout, f"refused at {ours.pointer}: {ours.detail}", theirs))
        elif "error" in theirs:
            disagree.append((layout, "planned", theirs["error"]))
        else:
            try:
                _holds(ours, theirs)
            except AssertionError as err:
                disagree.append((layout, f"mesh differs: {err}", theirs))
    assert not disagree, f"{len(disagree)} of {len(layouts)} differ; the first: {disagree[:3]}"
    refused = sum(isinstance(p, InvalidValue) for p in planned)
    assert 0.05 * len(layouts) < refused < 0.5 * len(layouts), refused  # both sides are exercised


def test_every_suggestion_builds_in_torchtitan_and_plans_its_mesh(
    layouts: list[dict[str, int]], suggested: list[dict[str, int]], titan: list[dict[str, Any]]
) -> None:
    assert suggested
    for layout, theirs in zip(suggested, titan[len(layouts) :], strict=True):
        assert "error" not in theirs, (layout, theirs)
        _holds(plan(_request(layout, layout["shard"], layout["expert"])), theirs)


def test_the_layouts_the_issue_named(planned: list[Any], titan: list[dict[str, Any]]) -> None:
    expert, context, alone = titan[:3]
    assert (expert["sizes"]["efsdp"], expert["sizes"]["ep"]) == (2, 2)
    assert planned[0].device_mesh.expert == 2 and planned[0].device_mesh.wrapper == "ddp"
    assert context["fsdp_enabled"] and context["sizes"]["fsdp"] == 2
    assert planned[1].device_mesh.wrapper == "hsdp" and planned[2].device_mesh.wrapper == "fsdp"
    assert alone["fsdp_enabled"] and not alone["dp_replicate_enabled"]
