"""Warnings for plans that are arithmetically fine but beyond any run that could finish.

A global batch of 4.5e15 with a cap of 1024 plans with 4.4e12 accumulation steps: every number
divides, and nothing says the run would take longer than the universe has existed. The limits
below are far past real runs, so a real plan never meets them; the warning says how long the
run would take at a speed no real step reaches, which makes the point without a judgement.
"""

from __future__ import annotations

from app.core.learning_rate.noise_scale import readable
from app.core.records.plan import SamplerPlan

# Accumulation: pipeline-parallel runs accumulate hundreds to a few thousand micro-batches per
# step; a million is no run's. Optimizer steps: BERT's pre-training took 1,000,000 (Devlin et
# al. 2018); a hundred times that is no run's either.
MAX_ACCUMULATION = 1_000_000
MAX_OPTIMIZER_STEPS = 100_000_000
MICRO_STEP_S = 0.001  # faster than any real forward and backward
OPTIMIZER_STEP_S = 0.01  # faster than any real all-reduced step

_UNITS = (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60))


def duration(seconds: float) -> str:
    for name, size in _UNITS:
        if seconds >= size:
            return f"{readable(seconds / size)} {name}"
    return f"{readable(seconds)} seconds"


def scale_warnings(accumulation: int, sampler: SamplerPlan | None) -> list[str]:
    out = []
    if accumulation > MAX_ACCUMULATION:
        out.append(
            f"gradient_accumulation_steps {accumulation} is beyond any real run: even at "
            f"{MICRO_STEP_S * 1000:g} ms a micro-batch, one optimizer step would take "
            f"{duration(accumulation * MICRO_STEP_S)}; a smaller global batch or a larger "
            f"micro-batch cap brings it down"
        )
    if sampler is not None:
        steps = sampler.total_optimizer_steps or sampler.optimizer_steps_per_epoch
        span = "the run" if sampler.total_optimizer_steps else "one epoch"
        if steps > MAX_OPTIMIZER_STEPS:
            out.append(
                f"{steps} optimizer steps in {span} is beyond any real run (BERT's pre-training "
                f"took 1000000): even at {OPTIMIZER_STEP_S * 1000:g} ms a step they would take "
                f"{duration(steps * OPTIMIZER_STEP_S)}; a larger global batch or fewer samples or "
                f"epochs brings it down"
            )
    return out
