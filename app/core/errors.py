"""Typed errors of the planner. The web layer maps each to an RFC 9457 problem."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FieldIssue:
    pointer: str  # RFC 6901 JSON pointer into the request, e.g. "/global_batch_size"
    detail: str


@dataclass(eq=False)
class PlanError(Exception):
    """A request the planner cannot turn into a plan. `slug` names the problem type."""

    detail: str
    pointer: str
    suggestions: dict[str, list[int]] = field(default_factory=dict)
    slug: str = "invalid-plan"
    title: str = "The plan request is invalid"

    def __post_init__(self) -> None:
        super().__init__(self.detail)

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


@dataclass(eq=False)
class TopologyError(PlanError):
    """The GPUs cannot be arranged into the requested parallel groups."""

    slug: str = "invalid-topology"
    title: str = "The cluster cannot be split into the requested parallel groups"
