"""What the export tests share (not a test module): a request body planned into an export's
input, and the literal arguments of a call in an exported Python text."""

from __future__ import annotations

import ast
from typing import Any

from app.core.exports import ExportInput
from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn


def export_input(body: dict[str, Any]) -> ExportInput:
    request = PlanRequestIn.model_validate(body).to_core()
    return ExportInput(request, plan(request))


def call_kwargs(text: str, name: str) -> dict[str, Any]:
    """The literal keyword arguments of the first call to `name` in exported Python source."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(name):
            return {
                k.arg: ast.literal_eval(k.value) for k in node.keywords if isinstance(k.value, ast.Constant)
            }
    raise AssertionError(f"no call to {name}")
