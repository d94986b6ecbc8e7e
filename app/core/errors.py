"""Typed domain errors. Each carries its kind; the web layer maps kinds to HTTP in one table
(`app.core.problems`), so nothing below the routers knows a status code."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Self, TypeVar

from app.core.records import record

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
    """An error a client can act on. `slug` names the problem type; `pointer` the request field,
    when there is one; `suggestions` the nearest valid values, each working on its own;
    `combined_suggestions` changes of several fields that work only together."""

    detail: str
    pointer: str = ""
    suggestions: dict[str, list[int]] = field(default_factory=dict)
    combined_suggestions: list[dict[str, int]] = field(default_factory=list)
    slug: str = "invalid-request"
    title: str = "The request is invalid"
    kind: ErrorKind = ErrorKind.INVALID
    retry_after: int | None = None  # seconds, for busy and unavailable

    def __post_init__(self) -> None:
        super().__init__(self.detail)

    @property
    def errors(self) -> list[FieldIssue]:
        return [FieldIssue(self.pointer, self.detail)] if self.pointer else []

    def under(self, prefix: str) -> Self:
        """The same error with its pointer moved under `prefix`: a plan request nested in a
        larger body (a check's `/plan`) names its fields from the body's root."""
        return dataclasses.replace(self, pointer=prefix + self.pointer)


@dataclass(eq=False)
class PlanError(DomainError):
    """A request the planner cannot turn into a plan."""

    slug: str = "invalid-plan"
    title: str = "The plan request is invalid"

    @property
    def errors(self) -> list[FieldIssue]:
        return [FieldIssue(self.pointer, self.detail)]


@dataclass(eq=False)
class InvalidValue(PlanError):
    """A value that is out of range or contradicts another value."""

    slug: str = "invalid-value"
    title: str = "A value in the request is invalid"


@dataclass(eq=False)
class InfeasiblePlan(PlanError):
    """Valid values that do not divide into whole per-replica numbers."""

    slug: str = "infeasible-plan"
    title: str = "The batch cannot be split as requested"
    kind: ErrorKind = ErrorKind.INFEASIBLE


@dataclass(eq=False)
class TopologyError(PlanError):
    """The GPUs cannot be arranged into the requested parallel groups."""

    slug: str = "invalid-topology"
    title: str = "The cluster cannot be split into the requested parallel groups"
    kind: ErrorKind = ErrorKind.INFEASIBLE


# The errors below keep the problem types the service has always answered with
# (`http-<status>`), so clients that match on `type` see no change.


@dataclass(eq=False)
class NotFound(DomainError):
    slug: str = "http-404"
    title: str = "Not found"
    kind: ErrorKind = ErrorKind.NOT_FOUND


@dataclass(eq=False)
class Conflict(DomainError):
    slug: str = "http-409"
    title: str = "HTTP error"
    kind: ErrorKind = ErrorKind.CONFLICT


@dataclass(eq=False)
class Busy(DomainError):
    slug: str = "http-429"
    title: str = "Too many requests"
    kind: ErrorKind = ErrorKind.BUSY


@dataclass(eq=False)
class Unavailable(DomainError):
    slug: str = "http-503"
    title: str = "HTTP error"
    kind: ErrorKind = ErrorKind.UNAVAILABLE


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
