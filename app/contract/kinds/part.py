"""What a check kind adds to the building of a spec (`request.build_spec`): a `RequestPart`
reads its field of the request's `CheckOptions` and writes its part of the `CheckSpec`.

build_spec plans the request's plan, lets every part change what the check trains (`trains`:
a run trains the plan with a dataset and a recipe) and refuse what cannot be checked, builds
the spec of the first step from it, then lets every part write its fields (`apply`), in the
registry's order (registry.py). A part refuses at the check request's field (a 422)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from app.core.records.plan import Plan
from app.core.records.plan_request import PlanRequest

if TYPE_CHECKING:
    from app.contract.request import CheckRequest
    from app.contract.spec import CheckSpec


@dataclass(frozen=True, slots=True)
class Trained:
    """What a check trains: the plan request (a run's has a dataset and a recipe) and its plan."""

    request: PlanRequest
    plan: Plan


class RequestPart:
    """A kind's part of building the spec; each step leaves what it is given by default."""

    option: ClassVar[str]  # the CheckOptions field the part reads

    def trains(self, request: CheckRequest, trained: Trained) -> Trained:
        """What the check trains once this part has had its say, before the spec is built."""
        return trained

    def apply(self, request: CheckRequest, trained: Trained, spec: CheckSpec) -> CheckSpec:
        """The spec with this part's fields."""
        return spec

    def replanned(self, spec: CheckSpec, fresh: CheckSpec) -> CheckSpec:
        """`fresh`, the spec the micro-batch search re-planned `spec` into (request.replan),
        with what of this part carries over: by default nothing."""
        return fresh
