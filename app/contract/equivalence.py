"""A check's verdict on DDP equivalence (`result.ddp_equivalence`): whether the DDP step's
gradient is the single-process gradient of the global batch, and each known cause found that
breaks it or that DDP's defaults trip over. The rank side finds them
(`app.worker.checks.equivalence`); schemas/check_results.py's EquivalenceOut documents them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    """One cause, the modules it was found in, what it does and how to fix it."""

    cause: str  # batch_norm, dropout, stochastic_depth, ..., unexplained (FindingOut lists them)
    modules: tuple[str, ...]  # at most 20 named
    detail: str
    fix: str
    breaks_equivalence: bool
    # The gradient is right, but DDP with its default arguments fails at the next step.
    fails_with_ddp_defaults: bool = False


@dataclass(frozen=True, slots=True)
class Equivalence:
    equivalent: bool  # the gradient matched and no finding breaks equivalence
    fails_with_ddp_defaults: bool  # a finding says so
    summary: str
    findings: tuple[Finding, ...]
