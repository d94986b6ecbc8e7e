"""RFC 9457 problem details, as every endpoint documents its errors."""

from __future__ import annotations

from pydantic import BaseModel, Field, JsonValue

from app.schemas.types import with_examples

PROBLEM_EXAMPLE: dict[str, JsonValue] = {
    "type": "urn:batchplan:problem:infeasible-plan",
    "title": "The batch cannot be split as requested",
    "status": 422,
    "detail": "global_batch_size 1000 is not a multiple of micro 32 x 16 replicas = 512",
    "errors": [
        {
            "pointer": "/global_batch_size",
            "detail": "global_batch_size 1000 is not a multiple of micro 32 x 16 replicas = 512",
        }
    ],
    "suggestions": {"global_batch_size": [1024, 512, 1536]},
}


class FieldErrorOut(BaseModel):
    pointer: str = Field(examples=["/global_batch_size"])
    detail: str


class ProblemOut(BaseModel):
    """RFC 9457 problem details."""

    model_config = with_examples(PROBLEM_EXAMPLE)

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldErrorOut] = []
    suggestions: dict[str, list[int]] = Field(
        {},
        description="Nearest valid values by field, nearest first. Each works when substituted "
        "into the request on its own, with everything else unchanged. The key is the field's path "
        "in the request, its parts joined by dots: `global_batch_size`, `parallelism.tensor`, "
        "`topology.num_nodes`, `topology.node_groups.0.num_nodes`; a plan request nested in a "
        "body (a check's or a schedule's `plan`) keeps these keys, and a query parameter is "
        "named alone (`port`).",
    )
    combined_suggestions: list[dict[str, int]] = Field(
        [],
        description="Changes that work only together: each object sets all of its fields at once "
        '(e.g. `{"global_batch_size": 1024, "micro_batch_size": 32}`), everything else unchanged; '
        "keys as in `suggestions`.",
        examples=[[{"global_batch_size": 1000, "micro_batch_size": 25}]],
    )
