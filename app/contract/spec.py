"""What a check runs, typed: built from a core Plan by `request.build_spec`, carried to every
rank by the codec (the job store, the pipe).

Pure (standard library and `app.core` only): the web process builds specs without torch.
The request's choices and ranges were checked where it came in (the HTTP schema, or
`request.check_request` for the rank program's JSON): a spec trusts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from app.contract.check_options import DEFAULT_BACKEND, DEFAULT_DTYPE, Backend, CheckWorkload, DType
from app.contract.kinds.lr_scaling import LrScalingSpec
from app.contract.kinds.stream import StreamCheck
from app.contract.kinds.throughput import ThroughputOptions
from app.contract.mesh_spec import mesh_sizes
from app.contract.model_registry import SYNTHETIC
from app.contract.options import FitOptions
from app.contract.spec_error import SpecError
from app.core.records.plan import BatchUnit, LossNormalizationName, LossReductionName, Plan, Split
from app.core.records.plan_request import DatasetSpec, PackingSpec, PlanRequest
from app.core.split.sampler import even_sampler, proportional_sampler


@dataclass(frozen=True, slots=True)
class ReplicaSlice:
    """Data-parallel replicas [start, stop) that share a micro-batch size and loss scale."""

    start: int
    stop: int
    micro_batch_size: int
    loss_scale: float


@dataclass(frozen=True, slots=True)
class CheckSpec:
    data_parallel_size: int
    global_batch_size: int
    gradient_accumulation_steps: int
    loss_reduction: LossReductionName
    split: Split  # "even": DistributedSampler; "proportional": ProportionalSampler
    slices: tuple[ReplicaSlice, ...]
    num_samples: int
    shuffle: bool
    data_seed: int
    drop_last: bool
    total_size: int  # the sampler's padded/truncated epoch length
    dtype: DType = DEFAULT_DTYPE
    seed: int = 0
    backend: Backend = DEFAULT_BACKEND
    model: str = SYNTHETIC  # a registered name; the worker resolves it when the check runs
    noise_steps: int = 0  # optimizer steps that measure the gradient noise scale
    noise_learning_rate: float = 0.0  # SGD between those steps; 0 measures at the start weights
    fit: FitOptions | None = None  # find the largest micro-batch that fits, then re-plan
    plan_request: PlanRequest | None = None  # the plan request, for that re-plan
    # "synthetic" (samples) or "tokens" (checks/token_check.py), with the plan's token settings.
    workload: CheckWorkload = "synthetic"
    sequence_length: int | None = None
    loss_normalization: LossNormalizationName = "sample"
    batch_unit: BatchUnit = "samples"  # what the plan request counted its batch in
    # Every mesh dimension's size when the plan runs a mesh check (mesh_spec.py), else None.
    mesh: dict[str, int] | None = None
    steps: int = 1  # optimizer steps to train (1: the one-step check)
    # A kind's part, one line a kind (app.contract.kinds: what writes it), each None when not asked.
    # Above 1 step, the plan the run trains (the request's, with a dataset and a recipe where it had none).
    run_plan: Plan | None = None
    # A resume: the plan the run goes on with after run_plan.resume.optimizer_step steps.
    resume_plan: Plan | None = None
    throughput: ThroughputOptions | None = None  # one replica's micro-step timed at each size, after
    lr_scaling: LrScalingSpec | None = None  # an lr-scaling probe after the first step
    packing: PackingSpec | None = None  # the plan's packed rows or token budget (tokens workload)
    stream: StreamCheck | None = None  # a stream plan: its epoch read through the real splitter

    def micro_batch_sizes(self) -> list[int]:
        sizes: list[int] = []
        for s in self.slices:
            sizes += [s.micro_batch_size] * (s.stop - s.start)
        return sizes

    def loss_scales(self) -> list[float]:
        scales: list[float] = []
        for s in self.slices:
            scales += [s.loss_scale] * (s.stop - s.start)
        return scales

    def exact_loss_scale(self, micro_batch_size: int) -> Fraction:
        """The scale CONTRACT.md defines, exactly; the plan's floats are what is checked."""
        dp, G = self.data_parallel_size, self.global_batch_size
        return Fraction(dp * micro_batch_size, G) if self.loss_reduction == "mean" else Fraction(dp, G)


def spec_from_plan(
    plan: Plan,
    *,
    dtype: DType = DEFAULT_DTYPE,
    seed: int = 0,
    backend: Backend = DEFAULT_BACKEND,
    dataset: DatasetSpec | None = None,
) -> CheckSpec:
    """The first optimizer step of `plan`. Without a dataset the epoch is exactly one global
    batch, shuffled with the check's seed."""
    if plan.stream is not None:
        dataset = None  # no sampler reads a stream: its epoch is the stream kind's (kinds/stream.py)
    data = dataset or DatasetSpec(num_samples=plan.global_batch_size, shuffle=True, seed=seed)
    dp, G, g = plan.data_parallel_size, plan.global_batch_size, plan.gradient_accumulation_steps
    slices = tuple(
        ReplicaSlice(
            r.start, r.stop, r.micro_batch_size, _sample_scale(r.loss_scale, dp, r.micro_batch_size, G)
        )
        for r in plan.replica_groups
    )
    # The epoch as the core's sampler arithmetic lays it out (the plan's own numbers when
    # the request had a dataset; the synthetic one-batch epoch otherwise).
    if plan.split == "even":
        micro = slices[0].micro_batch_size
        sampler = even_sampler(data, dp, micro, g)
        per_replica = sampler.num_samples_per_replica or 0
        if per_replica < g * micro:
            raise SpecError(
                f"each replica's shard holds {per_replica} samples, fewer than one optimizer step "
                f"({g} x {micro}); give at least {G} samples",
                "/plan/dataset/num_samples",
            )
    else:
        sampler = proportional_sampler(data, dp, G // g, g)
        steps = sampler.micro_steps_per_epoch
        if steps < g:
            raise SpecError(
                f"the epoch holds {steps} micro-steps, fewer than one optimizer step ({g}); "
                f"give at least {G} samples",
                "/plan/dataset/num_samples",
            )
    total = sampler.total_size
    return CheckSpec(
        data_parallel_size=dp,
        global_batch_size=G,
        gradient_accumulation_steps=g,
        loss_reduction=plan.loss_reduction,
        split=plan.split,
        slices=slices,
        num_samples=data.num_samples,
        shuffle=data.shuffle,
        data_seed=data.seed,
        drop_last=data.drop_last,
        total_size=total,
        dtype=dtype,
        seed=seed,
        backend=backend,
        **_token_fields(plan),
        mesh=mesh_sizes(plan),
    )


def _token_fields(plan: Plan) -> dict[str, Any]:
    """A plan normalised by tokens is checked on token sequences unless the request says."""
    if plan.tokens is None:
        return {}
    normalization = plan.tokens.loss_normalization
    return {
        "workload": "tokens" if normalization == "token" else "synthetic",
        "sequence_length": plan.tokens.sequence_length,
        "loss_normalization": normalization,
        "batch_unit": plan.tokens.unit,
    }


def _sample_scale(planned: float | None, dp: int, micro: int, G: int) -> float:
    """The plan's loss scale; under loss_normalization token (no constant scale) the mean
    loss's, which the token workload replaces with its own counts."""
    return planned if planned is not None else dp * micro / G


def replica_range(process: int, processes: int, replicas: int) -> range:
    """The contiguous replicas one process runs; sizes differ by at most one."""
    return range(process * replicas // processes, (process + 1) * replicas // processes)


def replicas_per_process(processes: int, replicas: int) -> int:
    return -(-replicas // processes)
