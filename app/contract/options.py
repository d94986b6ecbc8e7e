"""A check's options beyond the plan, typed: the noise-scale measurement, the search for the
largest micro-batch and the rendezvous of a check across hosts. Their JSON is read by the
codec (`app.contract.codec`): a field's name is its key."""

from __future__ import annotations

from dataclasses import dataclass

from app.contract.check_options import (
    DEFAULT_FIT_LIMIT,
    DEFAULT_FIT_OPTIMIZER,
    DEFAULT_KNEE_MARGIN,
    DEFAULT_LR_PROBE_POINTS,
    DEFAULT_LR_PROBE_TOLERANCE,
    DEFAULT_NOISE_STEPS,
    DEFAULT_THROUGHPUT_REPEATS,
    DEFAULT_THROUGHPUT_WARMUP,
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
class ThroughputOptions:
    """Measure one replica's micro-step at each of `micro_batch_sizes` (None: powers of two up
    to the plan's cap, app.contract.throughput): `warmup_steps` untimed, then the median of
    `repeats`; with `time_optimizer_step`, each timed step includes an optimizer step. The knee
    is the smallest micro-batch within `margin` of the fastest samples/s."""

    micro_batch_sizes: tuple[int, ...] | None = None
    repeats: int = DEFAULT_THROUGHPUT_REPEATS
    warmup_steps: int = DEFAULT_THROUGHPUT_WARMUP
    time_optimizer_step: bool = False
    margin: float = DEFAULT_KNEE_MARGIN


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """One check across hosts: every node's worker meets at `endpoint` under `run_id`."""

    endpoint: str
    nnodes: int
    run_id: str


@dataclass(frozen=True, slots=True)
class ResumeOptions:
    """A run (`steps` above 1) checkpointed after `at_step` optimizer steps on the plan's
    replicas and resumed on `data_parallel_size` replicas: the same plan re-made for that many
    replicas with the same global batch (app.core.resume.plan_resume)."""

    at_step: int
    data_parallel_size: int


@dataclass(frozen=True, slots=True)
class LrScalingOptions:
    """An lr-scaling probe: train `samples` samples at the base batch and, per rule, at the
    plan's global batch, evaluating at `points` sample counts; a rule holds while its final
    held-out loss is within `tolerance` (relative) of the base run's. `label_noise`: the
    standard deviation of Gaussian noise added to the built-in model's targets (its gradient
    noise knob)."""

    samples: int
    rules: tuple[str, ...] | None = None  # None: none, sqrt, linear and the plan's own
    points: int = DEFAULT_LR_PROBE_POINTS
    tolerance: float = DEFAULT_LR_PROBE_TOLERANCE
    label_noise: float = 0.0
