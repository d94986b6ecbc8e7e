"""Deliberately wrong setups a check runs next to the plan, to show that it tells them apart.

Each is a mistake people make with DDP. A control is run only where it changes the gradient
for the plan at hand (decided exactly, in rationals, over the samples it would read), and
must then differ from the reference by far more than the tolerance.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import lcm
from typing import TypeVar

import torch

from app.contract.check_result import SkippedControl
from app.contract.spec import CheckSpec
from app.worker.training.samplers import index_tensor

# How a control's replica reads its data.
SAMPLER = "sampler"  # through the plan's sampler, like the correct run
UNSHARDED = "unsharded"  # no DistributedSampler: every replica reads the same leading samples
WHOLE_BATCH = "whole_batch"  # the DataParallel habit: every replica loads the whole global batch


@dataclass(frozen=True, slots=True)
class Control:
    """A deliberately wrong setup that a check runs beside the plan and must tell apart: the
    one type every check kind's controls share (the mesh check's are exactly this)."""

    name: str
    description: str


@dataclass(frozen=True, slots=True)
class SampleControl(Control):
    """A mistake in how DDP replicas read their samples or scale their losses."""

    data: str
    reduction: str  # "mean" or "sum"; "plan" is the plan's own
    scale: str  # "plan", "plan_times_steps", "one_over_steps" or "one"

    def loss_scale(self, spec: CheckSpec, micro_batch_size: int) -> Fraction:
        g = spec.gradient_accumulation_steps
        if self.scale == "plan":
            return spec.exact_loss_scale(micro_batch_size)
        if self.scale == "plan_times_steps":
            return spec.exact_loss_scale(micro_batch_size) * g
        if self.scale == "one_over_steps":
            return Fraction(1, g)
        return Fraction(1)

    def loss_reduction(self, spec: CheckSpec) -> str:
        return spec.loss_reduction if self.reduction == "plan" else self.reduction


C = TypeVar("C", bound=Control)


def partition(
    controls: Iterable[C], harmless_because: Callable[[C], str | None]
) -> tuple[list[C], list[SkippedControl]]:
    """The controls that run (`harmless_because` gives None: the mistake changes this plan's
    gradient) and the others, each with the reason it would prove nothing here."""
    applicable: list[C] = []
    skipped: list[SkippedControl] = []
    for control in controls:
        reason = harmless_because(control)
        if reason is None:
            applicable.append(control)
        else:
            skipped.append(SkippedControl(control.name, reason))
    return applicable, skipped


CONTROLS: tuple[SampleControl, ...] = (
    SampleControl(
        "unweighted_mean",
        "plain mean loss divided by the accumulation steps, ignoring "
        "that replicas hold different micro-batches",
        SAMPLER,
        "mean",
        "one_over_steps",
    ),
    SampleControl(
        "accumulation_not_divided",
        "the plan's loss scale without dividing by the gradient accumulation steps",
        SAMPLER,
        "plan",
        "plan_times_steps",
    ),
    SampleControl("sum_without_scaling", "sum-reduced losses with no loss scale", SAMPLER, "sum", "one"),
    SampleControl(
        "whole_global_batch",
        "every replica loads the whole global batch (as under DataParallel) with the plan's loss scale",
        WHOLE_BATCH,
        "plan",
        "plan",
    ),
    SampleControl(
        "no_distributed_sampler",
        "no DistributedSampler: every replica reads the same samples",
        UNSHARDED,
        "plan",
        "plan",
    ),
)


def control_positions(control: SampleControl, spec: CheckSpec, micro_batch_size: int) -> list[range]:
    """Epoch positions of each micro-batch a control's replica reads, for non-sampler data."""
    g = spec.gradient_accumulation_steps
    per_step = spec.global_batch_size // g
    if control.data == WHOLE_BATCH:
        return [range(k * per_step, (k + 1) * per_step) for k in range(g)]
    if control.data == UNSHARDED:
        return [range(k * micro_batch_size, (k + 1) * micro_batch_size) for k in range(g)]
    raise ValueError(f"{control.name} reads through the sampler")


# Indices (a pooled replica group's as one tensor), loss scale, reduction, how many replicas.
WeightedBatch = tuple[Sequence[int] | torch.Tensor, Fraction, str, int]


def _weights(batches: Iterable[WeightedBatch], dp: int) -> tuple[dict[int, int], int]:
    """Each sample's weight in the DDP-averaged gradient, as whole numbers over a common
    denominator. Batches of equal weight are counted together, at C speed."""
    by_weight: dict[Fraction, Counter[int]] = defaultdict(Counter)
    for indices, scale, reduction, replicas in batches:
        weight = scale * replicas / (dp * (len(indices) if reduction == "mean" else 1))
        by_weight[weight].update(indices.tolist() if isinstance(indices, torch.Tensor) else indices)
    common = lcm(*(w.denominator for w in by_weight)) if by_weight else 1
    weights: dict[int, int] = defaultdict(int)
    for weight, counts in by_weight.items():
        whole = weight.numerator * (common // weight.denominator)
        for index, count in counts.items():
            weights[index] += whole * count
    return weights, common


def _harmless_rule(control: SampleControl, spec: CheckSpec) -> str | None:
    """Why the mistake does no harm on plans like `spec`, where a rule says so; None: no rule
    covers it (the exact test found equal weights for this plan's samples anyway)."""
    dp, g, sizes = spec.data_parallel_size, spec.gradient_accumulation_steps, spec.micro_batch_sizes()
    if control.name == "unweighted_mean" and len(set(sizes)) == 1:
        return "every replica has the same micro-batch, so a plain mean is already right"
    if control.name == "accumulation_not_divided" and g == 1:
        return "gradient_accumulation_steps is 1, so there is nothing to divide by"
    if control.name == "sum_without_scaling" and spec.global_batch_size == dp:
        return (
            "each replica's step is a single sample (micro-batch 1, no accumulation), so its sum is its mean"
        )
    if control.name == "whole_global_batch" and dp == 1:
        return "one replica already reads the whole global batch"
    if control.name == "whole_global_batch" and spec.loss_reduction == "mean":
        return (
            "with mean-reduced losses at the plan's scales, replicas that each read the whole global "
            "batch average to the right gradient: the mistake costs compute, not correctness"
        )
    if control.name == "no_distributed_sampler" and dp == 1:
        return "one replica: there is no shard to miss"
    return None


def split_controls(
    spec: CheckSpec,
    reads: Callable[[SampleControl], Iterable[WeightedBatch]],
    reference_batch: Sequence[int],
) -> tuple[list[SampleControl], list[SkippedControl]]:
    """The controls that change this plan's gradient (they run), and the others with the
    reason each does not apply. `reads(control)`: what every replica reads under it."""
    applicable, skipped, _ = weigh_controls(spec, reads, reference_batch)
    return applicable, skipped


def weigh_controls(
    spec: CheckSpec,
    reads: Callable[[SampleControl], Iterable[WeightedBatch]],
    reference_batch: Sequence[int],
) -> tuple[list[SampleControl], list[SkippedControl], dict[SampleControl, Fraction]]:
    """split_controls, and for each control that runs and weighs every sample c times as the
    reference does, that c (weight_ratio): on samples independent of each other its
    gradient is the reference gradient times c."""
    tensors = Tensors()  # the controls read the same few lists: each is made a tensor once
    ratios: dict[SampleControl, Fraction] = {}

    def harmless_because(control: SampleControl) -> str | None:
        ratio = weight_ratio(reads(control), reference_batch, spec.data_parallel_size, tensors)
        if ratio != 1:
            if ratio is not None:
                ratios[control] = ratio
            return None
        return _harmless_rule(control, spec) or (
            "on this plan's first step it weighs every sample as the plan does (the samples it "
            "reads coincide with the plan's)"
        )

    applicable, skipped = partition(CONTROLS, harmless_because)
    return applicable, skipped, ratios


class Tensors:
    """Index lists as int64 tensors, each made once: keyed by the list's identity, and holding
    the list, so that no other list can take its identity while this lives."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[Sequence[int], torch.Tensor]] = {}
        self._counted: dict[int, tuple[Sequence[int], torch.Tensor, torch.Tensor]] = {}

    def counted(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct samples of `indices`, sorted, and how often each occurs: made once
        (every control is weighed against the same reference batch)."""
        made = self._counted.get(id(indices))
        if made is None:
            every = self(indices)
            made = self._counted[id(indices)] = (indices, *per_sample(every, torch.ones_like(every)))
        return made[1], made[2]

    def __call__(self, indices: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(indices, torch.Tensor):
            return indices
        made = self._made.get(id(indices))
        if made is None:
            made = self._made[id(indices)] = (indices, index_tensor(indices))
        return made[1]


def weight_ratio(
    control_batches: Iterable[WeightedBatch],
    reference_batch: Sequence[int],
    dp: int,
    tensors: Tensors | None = None,
) -> Fraction | None:
    """c when the control weighs every sample exactly c times as the reference does (each
    occurrence in the reference batch 1/G); None when no one c does (other samples, or other
    proportions). 1: the mistake does no harm here: the gradient is linear in the per-sample
    weights and distinct samples have distinct gradients, so equal weights are exactly the
    case where it changes nothing.

    Each sample's weight as a whole number over a common denominator, summed per sample by
    torch (int64, where no product can overflow it; else in Python's integers).
    """
    batches = list(control_batches)
    by_weight: dict[Fraction, list[Sequence[int] | torch.Tensor]] = defaultdict(list)
    for indices, scale, reduction, replicas in batches:
        by_weight[scale * replicas / (dp * (len(indices) if reduction == "mean" else 1))].append(indices)
    if not by_weight or not reference_batch:
        return None
    common = lcm(*(w.denominator for w in by_weight))
    whole = {w: w.numerator * (common // w.denominator) for w in by_weight}
    bound = sum(abs(whole[w]) * len(i) for w, reads in by_weight.items() for i in reads)
    if bound * len(reference_batch) >= _INT64_SAFE:
        return weight_ratio_in_python(batches, reference_batch, dp)
    tensor = tensors or Tensors()
    parts = [(tensor(i), whole[w]) for w, reads in by_weight.items() for i in reads]
    every = torch.cat([t for t, _ in parts])
    weights = torch.cat([torch.full_like(t, w) for t, w in parts])
    samples, control = per_sample(every, weights)
    held, counts = tensor.counted(reference_batch)
    # Over common and len(reference_batch): proportional when the samples are the same and
    # control_i * counts_0 == control_0 * counts_i for every sample.
    if not torch.equal(samples, held) or not torch.equal(control * counts[0], control[0] * counts):
        return None
    return Fraction(int(control[0]), common) / Fraction(int(counts[0]), len(reference_batch))


_INT64_SAFE = 1 << 62


_DENSE_FROM = 1 << 12  # fewer reads sort as fast as they index a table


def per_sample(every: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct samples of `every`, sorted, and the sum of their `weights`: by index
    into a dense table where the indices are few beside the reads (a pass, not a sort:
    100,000 replicas read 300,000 samples), else through torch.unique."""
    if len(every) >= _DENSE_FROM and int(every.min()) >= 0 and int(every.max()) < 4 * len(every):
        size = int(every.max()) + 1
        totals = torch.zeros(size, dtype=torch.int64).index_add_(0, every, weights)
        samples = torch.bincount(every, minlength=size).nonzero().squeeze(1)
        return samples, totals[samples]
    samples, position = torch.unique(every, return_inverse=True)
    return samples, torch.zeros(len(samples), dtype=torch.int64).index_add_(0, position, weights)


def weight_ratio_in_python(
    control_batches: Iterable[WeightedBatch], reference_batch: Sequence[int], dp: int
) -> Fraction | None:
    """weight_ratio in Python's integers, sample by sample: any size, and slower."""
    control, c_common = _weights(control_batches, dp)
    reference, r_common = _weights([(reference_batch, Fraction(dp), "mean", 1)], dp)
    if not control or set(control) != set(reference):
        return None
    ratios = {Fraction(control[k] * r_common, reference[k] * c_common) for k in control}
    return ratios.pop() if len(ratios) == 1 else None
