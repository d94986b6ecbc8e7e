"""What a gradient check found, as rank 0 returns it: typed here, and `to_json()` gives the
dict the HTTP API and the stored jobs show (and the rank program prints), key for key;
`from_json` reads it back where it crosses a process (the TCPStore, the pipe).

The verdicts (`passed`, `gradient_matches`, `controls_detected`) are derived from the
measurements, so they cannot disagree with them. Sections built elsewhere as JSON
(`ddp_equivalence`, `noise_scale`, `micro_batch_search`) stay dicts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from app.contract.run_result import ONE_STEP, RunOutcome
from app.contract.timings import Timings


def _flat(item: Any) -> dict[str, Any]:
    """A dataclass's fields in declaration order, values as they are (no deep copy)."""
    return {f.name: getattr(item, f.name) for f in fields(item)}


@dataclass(frozen=True, slots=True)
class Setup:
    """Where and in what precision the check ran."""

    backend: str
    device: str  # "cpu" or "cuda"
    device_name: str
    dtype: str
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
    split: str

    def to_json(self) -> dict[str, Any]:
        return {**_flat(self), "micro_batch_sizes": list(self.micro_batch_sizes)}


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
class CheckResult:
    model: str
    ddp_equivalence: dict[str, Any]  # equivalence.verdict's
    setup: Setup
    layout: Layout
    gradient: Comparison
    controls: tuple[ControlOutcome, ...]
    controls_skipped: tuple[SkippedControl, ...]
    # Whether a replica was read through the plan's real sampler (see checks/shards.py).
    sampler_checked: bool
    noise_scale: dict[str, Any] | None
    micro_batch_search: dict[str, Any] | None
    timings: Timings
    torch_version: str
    # The mesh that ran ({"names": [...], "sizes": [...]}, torchtitan's order), None for a
    # plain DDP check; the data-parallel wrapper: "ddp", "fsdp" or "hsdp".
    mesh: dict[str, list[Any]] | None = None
    wrapper: str = "ddp"
    # The worker's node in a check across hosts (set by the pool; None under torchrun).
    node_rank: int | None = None
    workload: str = "synthetic"  # what ran: the spec's, never left for the reader to infer
    warnings: tuple[str, ...] = ()  # what holds for the check but not for the plan as written
    # A check of several optimizer steps: the run beside the reference run (None: one step).
    run: RunOutcome | None = None

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
        first_step = (
            self.gradient_matches and self.controls_detected and bool(self.ddp_equivalence["equivalent"])
        )
        return first_step and (self.run is None or self.run.matches)

    def with_run(
        self,
        run: RunOutcome,
        controls: tuple[ControlOutcome, ...],
        skipped: tuple[SkippedControl, ...],
        laps: dict[str, float],
    ) -> CheckResult:
        """This first step's result with the run that followed it: its trajectory, its
        run-level controls after the first step's, and its phases' times."""
        return dataclasses.replace(
            self,
            run=run,
            controls=self.controls + controls,
            controls_skipped=self.controls_skipped + skipped,
            timings=self.timings.with_laps(laps),
        )

    def with_setup_time(self, seconds: float) -> CheckResult:
        """This result with the time it took to form the process group (its caller formed it)."""
        return dataclasses.replace(self, timings=self.timings.with_setup(seconds))

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "gradient_matches": self.gradient_matches,
            "controls_detected": self.controls_detected,
            "model": self.model,
            "ddp_equivalence": self.ddp_equivalence,
            **_flat(self.setup),
            **self.layout.to_json(),
            **_flat(self.gradient),
            "controls": [_flat(c) for c in self.controls],
            "controls_not_applicable": list(self.controls_not_applicable),
            "controls_skipped": [_flat(c) for c in self.controls_skipped],
            "sampler_checked": self.sampler_checked,
            "noise_scale": self.noise_scale,
            "micro_batch_search": self.micro_batch_search,
            "timings_s": self.timings.to_json(),
            "torch_version": self.torch_version,
            "mesh": self.mesh,
            "wrapper": self.wrapper,
            "node_rank": self.node_rank,
            "workload": self.workload,
            "warnings": list(self.warnings),
            **(self.run.to_json() if self.run is not None else ONE_STEP),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        """The result `to_json` wrote (the verdicts are derived again, not read)."""
        return cls(
            model=data["model"],
            ddp_equivalence=data["ddp_equivalence"],
            setup=Setup(**_fields_of(Setup, data)),
            layout=Layout(
                **{**_fields_of(Layout, data), "micro_batch_sizes": tuple(data["micro_batch_sizes"])}
            ),
            gradient=Comparison(**_fields_of(Comparison, data)),
            controls=tuple(ControlOutcome(**c) for c in data["controls"]),
            controls_skipped=tuple(SkippedControl(**c) for c in data["controls_skipped"]),
            sampler_checked=data["sampler_checked"],
            noise_scale=data["noise_scale"],
            micro_batch_search=data["micro_batch_search"],
            timings=Timings.from_json(data["timings_s"]),
            torch_version=data["torch_version"],
            mesh=data["mesh"],
            wrapper=data["wrapper"],
            node_rank=data.get("node_rank"),
            workload=data.get("workload", "synthetic"),
            warnings=tuple(data.get("warnings", ())),
            run=RunOutcome.from_json(data),
        )


def _fields_of(kind: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    return {f.name: data[f.name] for f in fields(kind)}
