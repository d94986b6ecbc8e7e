"""A check request as JSON (the body of POST /v1/checks) to core types, without pydantic,
so that the rank program under torchrun takes the same input as the HTTP API.

The web layer validates with its schema first; here the core's own checks apply.
"""

from __future__ import annotations

from typing import Any

from app.core import models as core
from app.core.planner import plan
from app.worker.spec import CheckSpec, spec_from_plan


def plan_request(data: dict[str, Any]) -> core.PlanRequest:
    topology = data["topology"]
    if topology.get("node_groups"):
        topo = core.Topology(
            tuple(
                core.NodeGroup(
                    g.get("name") or f"group{i}",
                    g["num_nodes"],
                    g["gpus_per_node"],
                    float(g.get("relative_throughput", 1.0)),
                    g.get("max_micro_batch_size"),
                )
                for i, g in enumerate(topology["node_groups"])
            ),
            listed_groups=True,
        )
    else:
        topo = core.Topology.homogeneous(topology["num_nodes"], topology["gpus_per_node"])
    dataset = data.get("dataset")
    return core.PlanRequest(
        topology=topo,
        global_batch_size=data.get("global_batch_size"),
        micro_batch_size=data.get("micro_batch_size"),
        gradient_accumulation_steps=data.get("gradient_accumulation_steps"),
        max_micro_batch_size=data.get("max_micro_batch_size"),
        divisibility=core.Divisibility(data.get("divisibility", "exact")),
        parallelism=core.Parallelism(**data.get("parallelism", {})),
        loss_reduction=core.LossReduction(data.get("loss_reduction", "mean")),
        dataset=core.DatasetSpec(**dataset) if dataset else None,
    )


def spec_from_request(data: dict[str, Any]) -> CheckSpec:
    request = plan_request(data["plan"])
    return spec_from_plan(
        plan(request),
        dtype=data.get("dtype", "float64"),
        seed=data.get("seed", 0),
        backend=data.get("backend", "auto"),
        dataset=request.dataset,
    )
