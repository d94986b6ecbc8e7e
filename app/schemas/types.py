"""Field types and base models shared by the HTTP models."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue
from pydantic_core import PydanticCustomError

from app.core.records.plan_request import MAX_SAFE_INTEGER, MAX_WORLD_SIZE


def _whole_number(value: Any) -> Any:
    """JSON Schema's "integer" admits 2.0, so the service does too; but a string or a
    boolean is not a count, even where Python would convert it."""
    if isinstance(value, (bool, str)):
        raise PydanticCustomError("int_type", "Input should be a whole number")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# After the Field constraints in an Annotated int (`Annotated[int, Field(ge=1), WHOLE]`), so
# that the bounds stay in the JSON schema as minimum/maximum.
WHOLE = BeforeValidator(_whole_number)

# Strict: JSON `true` or "32" is not a batch size.
Count = Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER), WHOLE]
GpuCount = Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE), WHOLE]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# Strict as well: a JSON number (integer or not), never `true` or a string such as "NaN".
StrictPositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
StrictNonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


class RequestModel(BaseModel):
    """A request body part: an unknown field is a mistake the client hears about."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    """A response part, read from the core dataclass it documents."""

    model_config = ConfigDict(from_attributes=True)


def with_examples(*examples: JsonValue) -> ConfigDict:
    """A model's Swagger examples; pydantic merges this with the base model's config."""
    return ConfigDict(json_schema_extra={"examples": list(examples)})
