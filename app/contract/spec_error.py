"""SpecError: a check request that cannot be checked as asked, a 422 at the field of the check
request to change. Below the spec and the kinds' modules, which both raise it."""

from __future__ import annotations

from app.core.errors.domain import DomainError


class SpecError(DomainError, slug="invalid-value", title="A value in the request is invalid"):
    """A plan that cannot be checked as asked; `pointer` names the field of the check request."""
