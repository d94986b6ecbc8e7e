"""What a check kind is: the `CheckKind` protocol the driver (driver.py) runs, the `Context`
every phase of every kind reads, and `AfterKind`, the base of the kinds that run after the
others with nothing for every rank to do in some phases.

A check is a sequence of kinds on the same ranks, by stage (`STAGES`): one `step` kind (the
plan's first optimizer step against a single process: the plan's mesh, tokens, DDP replicas),
then at most one `run` kind (several steps of the plan's recipe: resumed, on a mesh, on DDP
replicas), then every `after` kind that applies to the spec (a throughput curve, an lr-scaling
probe), each adding to the result the one before it made. Within `step` and `run` the first
kind that applies in the registry's order runs, so a kind's `applies` asks about the spec
alone, never about another kind. The driver owns the skeleton of each: the phases in order,
their laps, the rank-0 gate before the reference, and the result's timings; a kind supplies
what each phase does (docs/architecture.md, "Adding a check kind").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Generic, Literal, Protocol, TypeVar

import torch

from app.contract.check_result import CheckResult
from app.contract.spec import CheckSpec
from app.contract.timings import Timer
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.shards import Shards
from app.worker.training.gradients import BatchFeed
from app.worker.training.mesh_models import Parallelize, registered_parallelize
from app.worker.training.workload import Workload

State = TypeVar("State")

Stage = Literal["step", "run", "after"]
# The stages in the order they run, and whether only the first kind that applies runs.
STAGES: tuple[tuple[Stage, bool], ...] = (("step", True), ("run", True), ("after", False))


class Context:
    """One check on this rank: the spec (a micro-batch search may replace it before the shards
    are read), the process group, the workload, and the clock every phase laps on."""

    def __init__(
        self, spec: CheckSpec, group: CheckGroup, workload: Workload, model_target: str | None
    ) -> None:
        self.spec, self.group, self.workload, self.model_target = spec, group, workload, model_target
        self.timer = PhaseTimer()

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.spec.dtype)
        return dtype

    @property
    def device(self) -> torch.device:
        return self.group.device

    @property
    def factor(self) -> float:
        """Processes / replicas: a process that runs several replicas sums their gradients, and
        DDP's mean over processes then equals the mean over replicas (gradients.micro_steps)."""
        return self.group.world / self.spec.data_parallel_size

    def feed(self, workload: Workload) -> BatchFeed:
        """How this rank runs `workload`'s batches in the spec's step."""
        return BatchFeed(workload, self.dtype, self.device, self.factor)

    @property
    def leader(self) -> bool:
        """Rank 0: the rank that holds the reference and writes the result."""
        return self.group.rank == 0

    @cached_property
    def shards(self) -> Shards:
        """What each replica reads in the first step, by the plan's sampler (read once asked)."""
        return Shards(self.spec)

    @cached_property
    def parallelize(self) -> Parallelize | None:
        """The registered model's own split into tensor-parallel shards and pipeline stages."""
        return registered_parallelize(self.model_target)


class PhaseTimer(Timer):
    """A Timer whose laps add up under one name, and which can set aside time spent inside a
    phase on another (a run's reference, trained in lockstep with it)."""

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self.last, 6)
        self.last = now

    def set_aside(self, name: str, seconds: float) -> None:
        """`seconds` of the running phase count under `name` instead."""
        self.laps[name] = round(self.laps.get(name, 0.0) + seconds, 6)
        self.last += seconds


@dataclass(frozen=True, slots=True)
class Laps:
    """The laps the driver records after a kind's phases; None: the phase is not timed apart."""

    plan: str = "step"
    controls: str | None = "controls"
    measure: str | None = None
    reference: str | None = "reference"


class CheckKind(Protocol[State]):
    """One way of checking a plan. `prepare` builds what the kind runs (and laps its own
    parts); `plan` runs the plan as a training job would; `controls` runs the deliberate
    mistakes the check must tell apart; `measure` anything else every rank takes part in (it
    says whether it ran); `reference` is rank 0's single-process answer; `result` judges them
    into the check's result (`prior`: the result of the kinds before it)."""

    name: ClassVar[str]
    stage: ClassVar[Stage]
    laps: ClassVar[Laps]

    def applies(self, spec: CheckSpec) -> bool: ...

    def prepare(self, ctx: Context) -> State: ...

    def plan(self, ctx: Context, state: State) -> None: ...

    def controls(self, ctx: Context, state: State) -> None: ...

    def measure(self, ctx: Context, state: State) -> bool: ...

    def reference(self, ctx: Context, state: State) -> None: ...

    def result(self, ctx: Context, state: State, prior: CheckResult | None) -> CheckResult: ...


class AfterKind(Generic[State]):
    """An `after` kind's phases that do nothing unless it says otherwise: one that runs on rank
    0 alone (in `reference`) or on every rank (in `plan`) writes only that phase, `applies`,
    `prepare` and `result`."""

    stage: ClassVar[Stage] = "after"

    def plan(self, ctx: Context, state: State) -> None:
        """Nothing every rank must do."""

    def controls(self, ctx: Context, state: State) -> None:
        """No controls: what it measures is not judged against a mistake."""

    def measure(self, ctx: Context, state: State) -> bool:
        return False

    def reference(self, ctx: Context, state: State) -> None:
        """No single-process answer of its own."""
