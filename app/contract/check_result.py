"""What a gradient check found, as rank 0 returns it: typed here, and what the codec writes of
it is what the job store keeps and GET /v1/checks/{id} serves, key for key
(schemas/check_results.py documents every key; tests hold the two together).

The verdicts (`passed`, `gradient_matches`, `controls_detected`) are derived from the
measurements, so they cannot disagree with them. Every section is a record, its own module's
where it has one (equivalence.py, noise_scale.py, micro_batch_search.py, throughput.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.contract.check_options import CheckWorkload, DType, ProcessGroupBackend
from app.contract.codec import FLAT, named
from app.contract.equivalence import Equivalence
from app.contract.micro_batch_search import MicroBatchSearch
from app.contract.noise_scale import NoiseScaleReport
from app.contract.run_result import RunOutcome
from app.contract.throughput import Throughput
from app.contract.timings import Timings, with_setup
from app.core.records.plan import Split, Wrapper
from app.core.records.resume import ResumeGroup


@dataclass(frozen=True, slots=True)
class Setup:
    """Where and in what precision the check ran."""

    backend: ProcessGroupBackend
    device: str  # "cpu" or "cuda"
    device_name: str
    dtype: DType
    nnodes: int
    processes: int


@dataclass(frozen=True, slots=True)
class Layout:
    """The batch split the check ran (after a micro-batch search re-planned it, if one did)."""

    data_parallel_size: int
    replicas_per_process: int
    global_batch_size: int
    micro_batch_sizes: tuple[int, ...]  # the distinct sizes, ascending
    gradient_accumulation_steps: int
    split: Split


@dataclass(frozen=True, slots=True)
class Comparison:
    """The DDP step's gradient against the single-process one."""

    max_abs_diff: float
    rel_l2: float
    tolerance: float

    @property
    def matches(self) -> bool:
        return math.isfinite(self.rel_l2) and self.rel_l2 <= self.tolerance


@dataclass(frozen=True, slots=True)
class ControlOutcome:
    """A deliberately wrong setup's gradient against the single-process one."""

    name: str
    description: str
    rel_l2: float
    max_abs_diff: float
    detected: bool


@dataclass(frozen=True, slots=True)
class SkippedControl:
    """A control that did not run: on this plan the mistake leaves the gradient as it is."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    """A resume check's resume: where the run was checkpointed, the replicas it went on with
    (the plan re-made for them, the same global batch), where each of their groups resumed in
    the epoch, and whether the run from the checkpoint on matched the uninterrupted reference."""

    at_step: int  # optimizer steps taken before the checkpoint: the first step after it
    epoch: int  # the epoch at_step lies in, and its step in it
    step_in_epoch: int
    data_parallel_size_before: int
    data_parallel_size_after: int
    micro_batch_size: int | None  # after the resume (None: its replica groups differ)
    gradient_accumulation_steps: int  # after the resume
    replica_groups: tuple[ResumeGroup, ...]  # each group's skip from its epoch's start, after set_epoch
    checkpoint: str  # what the checkpoint held and how the resumed ranks loaded it
    matches: bool  # every step from at_step on within the run's tolerance


@dataclass(frozen=True, slots=True)
class LossPoint:
    """A run's loss on the probe's held-out batch after `samples` training samples (None: the
    run diverged before)."""

    samples: int
    loss: float | None


@dataclass(frozen=True, slots=True)
class ProbeBase:
    """The lr-scaling probe's base run: the plan's base_batch_size at base_lr."""

    batch_size: int
    lr: float
    curve: tuple[LossPoint, ...]


@dataclass(frozen=True, slots=True)
class ProbeRule:
    """One rule's run at the plan's global batch: its final held-out loss over the base run's
    (None: it diverged), and whether that stays within the probe's tolerance."""

    rule: str
    lr: float
    curve: tuple[LossPoint, ...]
    final_loss_ratio: float | None
    holds: bool


@dataclass(frozen=True, slots=True)
class ProbeNoise:
    """The gradient noise scale B_simple at the start and at the end of the base run, and the
    global batch against the one the regime is read from (`start`, else `end`)."""

    start: float | None
    end: float | None
    batch_to_noise: float | None  # global batch / B_noise
    linear_overshoot: float | None  # McCandlish et al.: (B + B_noise) / (b + B_noise)


@dataclass(frozen=True, slots=True)
class LrScalingResult:
    """An lr-scaling probe's answer (`result.lr_scaling`), as a plan takes it back."""

    samples: int
    global_batch_size: int
    tolerance: float
    label_noise: float
    base: ProbeBase
    rules: tuple[ProbeRule, ...]
    best_rule: str
    plan_rule: str
    plan_rule_holds: bool
    noise_scale: ProbeNoise
    regime: str  # below_noise_scale, around_noise_scale, above_noise_scale or unknown
    verdict: str


@dataclass(frozen=True, slots=True)
class CheckResult:
    model: str
    ddp_equivalence: Equivalence
    setup: Setup = field(metadata=FLAT)
    layout: Layout = field(metadata=FLAT)
    gradient: Comparison = field(metadata=FLAT)
    controls: tuple[ControlOutcome, ...]
    controls_skipped: tuple[SkippedControl, ...]
    # Whether a replica was read through the plan's real sampler (see checks/shards.py).
    sampler_checked: bool
    noise_scale: NoiseScaleReport | None
    micro_batch_search: MicroBatchSearch | None
    timings: Timings = field(metadata=named("timings_s"))
    torch_version: str
    # The mesh that ran ({"names": [...], "sizes": [...]}, torchtitan's order), None for a
    # plain DDP check; the data-parallel wrapper.
    mesh: Mapping[str, list[Any]] | None = None
    wrapper: Wrapper = "ddp"
    # The worker's node in a check across hosts (set by the pool; None under torchrun).
    node_rank: int | None = None
    workload: CheckWorkload = "synthetic"  # what ran: the spec's, never left for the reader to infer
    warnings: tuple[str, ...] = ()  # what holds for the check but not for the plan as written
    steps: int = 1  # optimizer steps trained: 1 is the first step alone
    # A check of several optimizer steps: the run beside the reference run (None: one step).
    run: RunOutcome | None = field(default=None, metadata=FLAT)
    # A resume check (`resume`): the checkpoint and the replicas the run went on with.
    resume: ResumeOutcome | None = None
    # With `throughput`: one replica's micro-step timed at each micro-batch (contract/throughput.py).
    throughput: Throughput | None = None
    lr_scaling: LrScalingResult | None = None  # an lr-scaling probe (checks/lr_scaling_probe.py)

    derived: ClassVar[tuple[str, ...]] = (
        "passed",
        "gradient_matches",
        "controls_detected",
        "controls_not_applicable",
    )

    @property
    def gradient_matches(self) -> bool:
        return self.gradient.matches

    @property
    def controls_detected(self) -> bool:
        return all(c.detected for c in self.controls)

    @property
    def controls_not_applicable(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.controls_skipped)

    @property
    def passed(self) -> bool:
        first_step = self.gradient_matches and self.controls_detected and self.ddp_equivalence.equivalent
        resumed = self.resume is None or self.resume.matches
        return first_step and (self.run is None or self.run.trajectory_matches) and resumed

    def with_run(
        self,
        steps: int,
        run: RunOutcome,
        controls: tuple[ControlOutcome, ...],
        skipped: tuple[SkippedControl, ...],
    ) -> CheckResult:
        """This first step's result with the run that followed it: its trajectory, and its
        run-level controls after the first step's."""
        return dataclasses.replace(
            self,
            steps=steps,
            run=run,
            controls=self.controls + controls,
            controls_skipped=self.controls_skipped + skipped,
        )

    def with_setup_time(self, seconds: float) -> CheckResult:
        """This result with the time it took to form the process group (its caller formed it)."""
        return dataclasses.replace(self, timings=with_setup(self.timings, seconds))
