"""Typed domain errors. Each carries its kind; the web layer maps kinds to HTTP in one table
(`app.core.errors.problems`), so nothing below the routers knows a status code."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self, TypeVar

from app.core.records.record import record

T = TypeVar("T")


class ErrorKind(StrEnum):
    INVALID = "invalid"  # a value is out of range or contradicts another
    INFEASIBLE = "infeasible"  # valid values that cannot be met together
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # the resource is in a state that forbids the action
    BUSY = "busy"  # try again later (retry_after)
    UNAVAILABLE = "unavailable"  # this server cannot do it now, or at all


def field_key(pointer: str) -> str:
    """A suggestion's key: the field's path in the request, its parts joined by dots
    (`/topology/node_groups/0/num_nodes` -> `topology.node_groups.0.num_nodes`). A plan
    request's fields keep their keys where a body nests it (a check's or a schedule's `plan`),
    and a query parameter is named alone (`/query/port` -> `port`)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.strip("/").split("/") if p]
    if len(parts) > 1 and parts[0] in ("plan", "query"):
        parts = parts[1:]
    return ".".join(parts)


@record
class FieldIssue:
    pointer: str  # RFC 6901 JSON pointer into the request, e.g. "/global_batch_size"
    detail: str


@dataclass(eq=False)
class DomainError(Exception):
    """An error a client can act on. `pointer` names the request field, when there is one;
    `suggestions` the nearest valid values, each working on its own; `combined_suggestions`
    changes of several fields that work only together. The problem type is the class's:
    `slug` names it, `kind` is what the web layer maps to a status, each subclass sets them in
    its class line (`class NotFound(DomainError, slug=..., title=..., kind=...)`)."""

    detail: str
    pointer: str = ""
    suggestions: dict[str, list[int]] = field(default_factory=dict)
    combined_suggestions: list[dict[str, int]] = field(default_factory=list)
    retry_after: int | None = None  # seconds, for busy and unavailable

    slug: ClassVar[str] = "invalid-request"
    title: ClassVar[str] = "The request is invalid"
    kind: ClassVar[ErrorKind] = ErrorKind.INVALID

    def __init_subclass__(
        cls, *, slug: str | None = None, title: str | None = None, kind: ErrorKind | None = None, **rest: Any
    ) -> None:
        super().__init_subclass__(**rest)
        cls.slug = slug or cls.slug
        cls.title = title or cls.title
        cls.kind = kind or cls.kind

    def __post_init__(self) -> None:
        super().__init__(self.detail)

    @property
    def errors(self) -> list[FieldIssue]:
        return [FieldIssue(self.pointer, self.detail)] if self.pointer else []

    def under(self, prefix: str) -> Self:
        """The same error with its pointer moved under `prefix`: a plan request nested in a
        larger body (a check's `/plan`) names its fields from the body's root."""
        return dataclasses.replace(self, pointer=prefix + self.pointer)


class PlanError(DomainError, slug="invalid-plan", title="The plan request is invalid"):
    """A request the planner cannot turn into a plan."""

    @property
    def errors(self) -> list[FieldIssue]:
        return [FieldIssue(self.pointer, self.detail)]


class InvalidValue(PlanError, slug="invalid-value", title="A value in the request is invalid"):
    """A value that is out of range or contradicts another value."""


class InfeasiblePlan(
    PlanError,
    slug="infeasible-plan",
    title="The batch cannot be split as requested",
    kind=ErrorKind.INFEASIBLE,
):
    """Valid values that do not divide into whole per-replica numbers."""


class TopologyError(
    PlanError,
    slug="invalid-topology",
    title="The cluster cannot be split into the requested parallel groups",
    kind=ErrorKind.INFEASIBLE,
):
    """The GPUs cannot be arranged into the requested parallel groups."""


# The errors below keep the problem types the service has always answered with
# (`http-<status>`), so clients that match on `type` see no change.


class NotFound(DomainError, slug="http-404", title="Not found", kind=ErrorKind.NOT_FOUND):
    pass


class Conflict(DomainError, slug="http-409", title="HTTP error", kind=ErrorKind.CONFLICT):
    pass


class Busy(DomainError, slug="http-429", title="Too many requests", kind=ErrorKind.BUSY):
    pass


class Unavailable(DomainError, slug="http-503", title="HTTP error", kind=ErrorKind.UNAVAILABLE):
    pass


def passes(check: Callable[[T], Any], error: type[Exception]) -> Callable[[T], bool]:
    """Whether `check(request)` runs without raising `error`: how a suggested request is tried
    (the planner's and the elastic plan's alike)."""

    def passing(request: T) -> bool:
        try:
            check(request)
        except error:
            return False
        return True

    return passing
