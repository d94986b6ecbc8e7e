"""The `tokens` check: one DDP step of a language model on sequences of varying valid length,
against the single-process gradient of the mean per-token loss over every valid token of the
step, with the token-normalisation mistakes as controls.

Under `loss_normalization: token` each micro-batch's summed token loss is multiplied by
data_parallel_size / N, where N, the step's valid tokens over all micro-batches and replicas,
is all-reduced over the process group as torchtitan does; DDP's mean over replicas then gives
every token the weight 1/N. Under `sample` the plan's loss scale multiplies each micro-batch's
mean over its own tokens, which is what the `mean_per_micro_batch` control also does: the
check shows what that costs on this data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from app.contract.check_result import CheckResult, SkippedControl
from app.contract.sequence_length import sequence_length_warning
from app.contract.spec import CheckSpec, replica_range
from app.worker.checks import equivalence
from app.worker.checks.controls import Control, partition
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.result_parts import Measured, judged_result
from app.worker.training.gradients import Batch, ddp_gradient, reference_gradient, weighted_gradients
from app.worker.training.packed_model import refuse_packed
from app.worker.training.sync_batch_norm import forward_is_collective
from app.worker.training.token_model import TokenWorkload
from app.worker.training.workload import Registered, Workload

Counts = dict[int, list[tuple[int, int]]]  # replica -> (valid tokens, label positions) per micro-batch
Scale = Callable[[int, int, Counts], Fraction]  # (replica, micro-step, counts) -> multiplier of the token sum


@dataclass(frozen=True, slots=True)
class TokenControl(Control):
    """A mistake in how a step's token losses are normalised."""

    scale: Scale
    harmless_when: str  # why it does not change this plan's gradient, when it does not


def _total(counts: Counts, which: int) -> int:
    return sum(c[which] for batches in counts.values() for c in batches)


def _per_micro_batch(r: int, k: int, counts: Counts) -> Fraction:
    valid = counts[r][k][0]
    return Fraction(1, len(counts[r]) * valid) if valid else Fraction(0)


def _per_replica(r: int, k: int, counts: Counts) -> Fraction:
    valid = sum(c[0] for c in counts[r])
    return Fraction(1, valid) if valid else Fraction(0)


def _padding_counted(r: int, k: int, counts: Counts) -> Fraction:
    return Fraction(len(counts), _total(counts, 1))


TOKEN_CONTROLS = (
    TokenControl(
        "mean_per_micro_batch",
        "each micro-batch averages its loss over its own valid tokens, divided by the accumulation "
        "steps (Hugging Face Transformers' gradient-accumulation bug until num_items_in_batch)",
        _per_micro_batch,
        "every micro-batch of the step holds the same number of valid tokens",
    ),
    TokenControl(
        "mean_per_replica",
        "each rank averages its loss over its own valid tokens of the step; DDP averages the ranks",
        _per_replica,
        "every replica's share of the step holds the same number of valid tokens",
    ),
    TokenControl(
        "padding_counted",
        "the loss is divided by all token positions of the step, padding included",
        _padding_counted,
        "the step has no padding: every position is a valid token",
    ),
)


def _weights(scale: Scale, counts: Counts) -> set[Fraction]:
    """Each valid token's weight in the DDP-averaged gradient (scale / replicas)."""
    return {
        scale(r, k, counts) / len(counts)
        for r, batches in counts.items()
        for k, c in enumerate(batches)
        if c[0]
    }


def changes_gradient(scale: Scale, counts: Counts) -> bool:
    """Whether a scaling weighs any valid token other than 1/N: the gradient is linear in the
    per-token weights, so equal weights are exactly where it does no harm."""
    return _weights(scale, counts) != {Fraction(1, _total(counts, 0))}


def _workload(spec: CheckSpec, workload: Workload | None) -> TokenWorkload:
    if isinstance(workload, TokenWorkload):
        return workload
    base = workload if isinstance(workload, Registered) else None
    return TokenWorkload(spec.seed, spec.sequence_length, base)


def refuse_before_group(spec: CheckSpec, workload: Workload) -> None:
    """The sequence-length refusal of the tokens kind (TokenStep), for a rank program about to join its
    process group: every rank refuses alike before it joins, since once in the group the first
    rank to exit closes the store under the others (one then failed with a connection reset
    instead of the refusal). Raises SpecError; nothing when the check may run."""
    refuse_packed(spec)
    if spec.workload == "tokens" and isinstance(workload, Registered):
        sequence_length_warning(spec, _workload(spec, workload).data_sequence_length)


@dataclass
class _Step:
    """What the tokens kind builds and measures on this rank."""

    tokens: TokenWorkload
    warning: str | None
    module: torch.nn.Module
    model: DistributedDataParallel
    local: range
    sampled: dict[int, list[list[int]]]
    every: dict[int, list[list[int]]]  # every replica's micro-batches (derived where not local)
    counts: Counts
    global_valid: int = 0
    grad: torch.Tensor | None = None
    control_grads: list[tuple[Control, torch.Tensor]] = field(default_factory=list)
    skipped: list[SkippedControl] = field(default_factory=list)
    reference: torch.Tensor | None = None


class TokenStep:
    """The plan's first step on sequences of varying valid length, token-normalised."""

    name: ClassVar[str] = "tokens"
    stage: ClassVar[Stage] = "step"
    laps: ClassVar[Laps] = Laps()

    def applies(self, spec: CheckSpec) -> bool:
        return spec.workload == "tokens"

    def prepare(self, ctx: Context) -> _Step:
        spec, group = ctx.spec, ctx.group
        tokens = _workload(spec, ctx.workload)
        # Admission compared them when the probe had read the model (a 422 with what works); here
        # for a check submitted before it had, and under torchrun. Every rank raises alike.
        warning = sequence_length_warning(spec, tokens.data_sequence_length)
        dp = spec.data_parallel_size
        local = replica_range(group.rank, group.world, dp)
        module = tokens.module(ctx.dtype, ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=device_ids)
        shards = ctx.shards
        sampled = shards.local(local)
        every = {r: sampled.get(r) or shards.derived(r) for r in range(dp)}
        counts: Counts = {r: [tokens.counts(b, ctx.device) for b in every[r]] for r in range(dp)}
        ctx.timer.lap("data")
        return _Step(tokens, warning, module, model, local, sampled, every, counts)

    def _scale(self, ctx: Context, state: _Step) -> Scale:
        spec, dp = ctx.spec, ctx.spec.data_parallel_size

        def plan_scale(r: int, k: int, c: Counts) -> Fraction:
            if spec.loss_normalization == "token":
                return Fraction(dp, state.global_valid)
            # The plan's sample scale on each micro-batch's own token mean.
            return Fraction(spec.loss_scales()[r]) / c[r][k][0] if c[r][k][0] else Fraction(0)

        return plan_scale

    def _batches(self, state: _Step, scale: Scale) -> list[Batch]:
        return [
            (b, float(scale(r, k, state.counts)), "sum")
            for r in state.local
            for k, b in enumerate(state.sampled[r])
        ]

    def _step(self, ctx: Context, state: _Step, scale: Scale) -> torch.Tensor:
        return ddp_gradient(state.model, self._batches(state, scale), ctx.feed(state.tokens))

    def plan(self, ctx: Context, state: _Step) -> None:
        state.global_valid = _all_reduced_valid_tokens(state.counts, state.local, ctx.device)
        state.grad = self._step(ctx, state, self._scale(ctx, state))

    def controls(self, ctx: Context, state: _Step) -> None:
        applicable, state.skipped = partition(
            TOKEN_CONTROLS, lambda c: None if changes_gradient(c.scale, state.counts) else c.harmless_when
        )
        if forward_is_collective(state.module):
            state.control_grads = [(c, self._step(ctx, state, c.scale)) for c in applicable]
            return
        runs = [self._batches(state, c.scale) for c in applicable]
        gradients = weighted_gradients(state.module, runs, ctx.feed(state.tokens))
        state.control_grads = list(zip(applicable, gradients, strict=True))

    def measure(self, ctx: Context, state: _Step) -> bool:
        return False

    def reference(self, ctx: Context, state: _Step) -> None:
        dp = ctx.spec.data_parallel_size
        batch = [i for r in range(dp) for b in state.every[r] for i in b]
        state.reference = reference_gradient(state.tokens, batch, ctx.dtype, ctx.device)

    def result(self, ctx: Context, state: _Step, prior: CheckResult | None) -> CheckResult:
        assert state.grad is not None and state.reference is not None
        findings = equivalence.static_findings(state.module, ctx.spec)
        shards = ctx.shards
        measured = Measured(
            state.grad,
            state.reference,
            state.control_grads,
            state.skipped,
            findings,
            shards.sampler_checked,
            shards.sizes,
        )
        warnings = (state.warning,) if state.warning else ()
        return judged_result(ctx.spec, ctx.group, state.tokens.name, measured, warnings=warnings)


def _all_reduced_valid_tokens(counts: Counts, local: range, device: torch.device) -> int:
    """The step's valid tokens as a training job gets them: each process counts its replicas'
    micro-batches, and an all-reduce sums the counts (torchtitan's global_valid_tokens)."""
    valid = torch.tensor([sum(c[0] for r in local for c in counts[r])], dtype=torch.int64, device=device)
    dist.all_reduce(valid)
    if int(valid) != _total(counts, 0):
        raise RuntimeError(
            f"the all-reduced valid tokens {int(valid)} differ from the step's {_total(counts, 0)}"
        )
    return int(valid)
