"""What the export tests share (not a test module): a request body planned into an export's
input, the literal arguments of a call in an exported Python text, and the bodies they plan."""

from __future__ import annotations

import ast
from typing import Any

from support.bodies import node_groups

from app.core.exports.parts.export_types import ExportInput
from app.core.planner import law_request, plan
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES
from app.schemas.plan_requests import PlanRequestIn


def export_input(body: dict[str, Any]) -> ExportInput:
    """The request and its plan as the registry hands them to a format: a scaling law's batch and
    lr written into the request (app.core.planner.law_request)."""
    request = PlanRequestIn.model_validate(body).to_core()
    return ExportInput(law_request(request), plan(request))


def call_kwargs(text: str, name: str) -> dict[str, Any]:
    """The literal keyword arguments (constants, dicts, lists of them) of the first call to
    `name` in exported Python source."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(name):
            out = {}
            for k in node.keywords:
                try:
                    out[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    continue  # not a literal: an expression of the file's own names
            return out
    raise AssertionError(f"no call to {name}")


# Request bodies the export tests plan: the documented examples, by how their clusters split.
EVEN = {name: ex["value"] for name, ex in EXAMPLES.items() if not name.startswith("mixed")}
MIXED = EXAMPLES["mixed"]["value"]
MIXED_CURVES = EXAMPLES["mixed_curves"]["value"]  # the same cluster split by measured curves
# Two node groups of the same shape, split unevenly by throughput: ranks must be pinned.
PINNED = {
    "topology": node_groups(("h100", 2, 8, 2.0), ("a100", 1, 8, 1.0)),
    "global_batch_size": 1000,
}
SINGLE = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 64}
