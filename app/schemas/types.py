"""Field types shared by the HTTP models."""

from __future__ import annotations

from typing import Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError


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
