"""A check's gradient noise scale measurement (`result.noise_scale`): McCandlish et al.'s
B_simple over the check's steps, each step's estimate, and what the global batch costs against
it, withheld where the estimate cannot be trusted. Measured on the ranks
(`app.worker.measure.noise_measurement`, the arithmetic in `app.core.learning_rate.noise_scale`);
schemas/check_results.py's NoiseScaleOut documents it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class NoiseStep:
    step: int  # from 1
    gradient_sq: float
    trace: float
    b_simple: float | None  # the estimate after this step


@dataclass(frozen=True, slots=True)
class NoiseEfficiency:
    """The global batch against the critical batch (as a plan's `efficiency`)."""

    batch_to_critical: float
    steps_vs_min: float
    samples_vs_min: float
    step_efficiency: float
    sample_efficiency: float
    verdict: str  # near_critical, above_critical or below_critical


@dataclass(frozen=True, slots=True)
class NoiseScaleReport:
    b_simple: float | None  # tr(S)/|G|^2 from the moving averages, in samples
    stderr: float | None
    relative_stderr: float | None
    steps: int
    decay: float
    gradient_sq: float
    trace: float
    small_batch: float
    small_batch_is: Literal["replica", "micro_batch"]
    big_batch: int
    learning_rate: float
    history: tuple[NoiseStep, ...]
    critical_batch_size: float | None
    efficiency: NoiseEfficiency | None
    recommendation: str
    reliable: bool = True
    unreliable_because: tuple[str, ...] = ()

    def distrusted(self, reasons: Sequence[str]) -> NoiseScaleReport:
        """This measurement kept, with no critical batch, efficiency or recommendation drawn
        from it, and the reasons why not."""
        because = (*self.unreliable_because, *reasons)
        value = self.b_simple
        return dataclasses.replace(
            self,
            reliable=False,
            unreliable_because=because,
            critical_batch_size=None,
            efficiency=None,
            recommendation=self.recommendation
            if value is None
            else f"no recommendation from B_simple {value:.4g}: " + "; ".join(because),
        )
