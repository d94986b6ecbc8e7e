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
from app.contract.kinds.lr_scaling import LrScalingResult
from app.contract.kinds.resume import ResumeOutcome
from app.contract.kinds.run import RunOutcome
from app.contract.kinds.throughput import Throughput
from app.contract.micro_batch_search import MicroBatchSearch
from app.contract.noise_scale import NoiseScaleReport
from app.contract.timings import Timings, with_setup
from app.core.records.plan import Split, Wrapper


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
class CheckedSplit:
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
    """A deliberately wrong setup's gradient against the single-process one.

    A control whose collective hung (some ranks waited for peers that never came, ended by its
    timeout) has no gradient: rel_l2 and max_abs_diff are None, hung and detected True."""

    name: str
    description: str
    rel_l2: float | None  # None when the control hung
    max_abs_diff: float | None  # None when the control hung
    detected: bool
    hung: bool = False  # last field, with a default: stored results still decode

    @classmethod
    def hung_outcome(cls, name: str, description: str) -> ControlOutcome:
        return cls(name, description, None, None, detected=True, hung=True)


@dataclass(frozen=True, slots=True)
class SkippedControl:
    """A control that did not run: on this plan the mistake leaves the gradient as it is."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class CheckResult:
    model: str
    ddp_equivalence: Equivalence
    setup: Setup = field(metadata=FLAT)
    layout: CheckedSplit = field(metadata=FLAT)
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
    # A kind's result, one line a kind (app.contract.kinds: its record), each None when not asked.
    run: RunOutcome | None = field(default=None, metadata=FLAT)  # steps above 1: beside the reference
    resume: ResumeOutcome | None = None  # the checkpoint and the replicas the run went on with
    throughput: Throughput | None = None  # one replica's micro-step timed at each micro-batch
    lr_scaling: LrScalingResult | None = None  # an lr-scaling probe

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
