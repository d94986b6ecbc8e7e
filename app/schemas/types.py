"""Field types and base models shared by the HTTP models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import annotated_types as at
from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, JsonValue, Strict
from pydantic_core import PydanticCustomError

from app.contract.limits import CHECK_LIMITS
from app.core.request.bounds import Bounds
from app.core.request.limits import COUNT, GPUS, PLAN_LIMITS


def _whole_number(value: Any) -> Any:
    """JSON Schema's "integer" admits 2.0, so the service does too; but a string or a
    boolean is not a count, even where Python would convert it."""
    if isinstance(value, (bool, str)):
        raise PydanticCustomError("int_type", "Input should be a whole number")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# After the bounds in an Annotated int (`Annotated[int, Field(ge=1), WHOLE]`), so that they
# stay in the JSON schema as minimum/maximum.
WHOLE = BeforeValidator(_whole_number)


class Limit(at.GroupedMetadata):
    """A field's bounds from a table of limits (app.core.request.limits, app.contract.limits), as
    pydantic's constraints: `Annotated[int, plan_limit("dataset.epochs")] | None`. The bounds
    appear in the JSON schema as minimum/maximum (minItems/maxItems for a list); a whole number
    refuses a boolean or a string (WHOLE), a float is a finite JSON number (strict: not "0.1",
    not true), as the core's check of JSON that did not come through this schema refuses them."""

    __slots__ = ("bounds",)

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds

    def __iter__(self) -> Iterator[object]:
        b = self.bounds
        if b.kind == "items":
            return iter(
                [at.MinLen(int(n)) for n in [b.ge] if n is not None]
                + [at.MaxLen(int(n)) for n in [b.le] if n is not None]
            )
        given: list[object] = [
            kind(n)
            for kind, n in ((at.Ge, b.ge), (at.Gt, b.gt), (at.Le, b.le), (at.Lt, b.lt))
            if n is not None
        ]
        return iter(given + ([WHOLE] if b.kind == "int" else [Strict(), AllowInfNan(False)]))


def plan_limit(path: str) -> Limit:
    """The plan request field's bounds (`topology.node_groups[].num_nodes`)."""
    return Limit(PLAN_LIMITS[path])


def check_limit(path: str) -> Limit:
    """The check request field's bounds (`throughput.repeats`)."""
    return Limit(CHECK_LIMITS[path])


# A batch size and a GPU count as the plan request takes them, for the bodies beyond it (the
# elastic and schedule requests) that take the same.
Count = Annotated[int, Limit(COUNT)]
GpuCount = Annotated[int, Limit(GPUS)]


class RequestModel(BaseModel):
    """A request body part: an unknown field is a mistake the client hears about."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    """A response part, read from the core dataclass it documents."""

    model_config = ConfigDict(from_attributes=True)


def with_examples(*examples: JsonValue) -> ConfigDict:
    """A model's Swagger examples; pydantic merges this with the base model's config."""
    return ConfigDict(json_schema_extra={"examples": list(examples)})
