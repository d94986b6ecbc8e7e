"""A check's options beyond the plan that belong to no kind of its own, typed: the noise-scale
measurement, the search for the largest micro-batch and the rendezvous of a check across hosts
(a kind's options are in its module, app.contract.kinds). Their JSON is read by the codec
(`app.contract.codec`): a field's name is its key."""

from __future__ import annotations

from dataclasses import dataclass

from app.contract.check_options import (
    DEFAULT_FIT_LIMIT,
    DEFAULT_FIT_OPTIMIZER,
    DEFAULT_NOISE_STEPS,
    FitOptimizer,
)


@dataclass(frozen=True, slots=True)
class NoiseOptions:
    """Measure the gradient noise scale over `steps` optimizer steps (0: not at all), with
    plain SGD at `learning_rate` between them (0: every step at the starting weights)."""

    steps: int = DEFAULT_NOISE_STEPS
    learning_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Find the largest micro-batch that fits in `memory_bytes` (None: the GPU's own memory)
    less `safety_margin` (None: the device's default), then re-plan under it."""

    memory_bytes: int | None = None
    safety_margin: float | None = None
    optimizer: FitOptimizer = DEFAULT_FIT_OPTIMIZER
    max_micro_batch_size: int = DEFAULT_FIT_LIMIT


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """One check across hosts: every node's worker meets at `endpoint` under `run_id`."""

    endpoint: str
    nnodes: int
    run_id: str
