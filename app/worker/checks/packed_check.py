"""The `tokens` check of a packed or budgeted plan: several seeded steps of documents of random
lengths, packed into rows (through transformers' DataCollatorWithFlattening) or filled into
micro-batches up to the token budget, so that ranks hold unequal targets and, under a budget,
run unequal numbers of micro-batches; every step's DDP gradient against the single-process
mean over every valid target of the step, with the normalisation mistakes as controls, and
an all-reduce per micro-batch on unequal counts, which hangs (hang.py detects it), and, over
the steps trained one after another, DeepSpeed's lr rescaling (packed_lr.py).

Each rank sums its per-target losses over every micro-batch of the step, times
data_parallel_size / N with N the step's targets all-reduced before the first backward; all but
a rank's last micro-batch run under no_sync, so each rank makes one synchronised backward a step
whatever its micro-batch count. The steps all start from the initial weights: each is a fresh
draw of documents, and the gradients of all of them are compared at once (concatenated).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from app.contract.check_result import CheckResult, ControlOutcome, SkippedControl
from app.contract.packed import PACKED_STEPS
from app.contract.spec import CheckSpec, replica_range
from app.worker.checks.controls import Control, partition
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.packed_lr import lr_rescaled_outcome
from app.worker.checks.result_parts import Measured, judged_result
from app.worker.checks.token_check import Counts, Scale, TokenControl, changes_gradient
from app.worker.training.gradients import Batch, ddp_gradient, weighted_gradients
from app.worker.training.hang import HANG_TIMEOUT_S, hangs
from app.worker.training.packed_model import PackedWorkload, documents, refuse_packed, targets


def _total(counts: Counts, which: int) -> int:
    return sum(c[which] for batches in counts.values() for c in batches)


def _per_micro_batch(r: int, k: int, counts: Counts) -> Fraction:
    valid = counts[r][k][0]
    return Fraction(1, len(counts[r]) * valid) if valid else Fraction(0)


def _per_rank(r: int, k: int, counts: Counts) -> Fraction:
    valid = sum(c[0] for c in counts[r])
    return Fraction(1, valid) if valid else Fraction(0)


def _world_size_kept(r: int, k: int, counts: Counts) -> Fraction:
    return Fraction(1, _total(counts, 0))


def _boundary_counted(r: int, k: int, counts: Counts) -> Fraction:
    return Fraction(len(counts), _total(counts, 1))


PACKED_CONTROLS = (
    TokenControl(
        "per_micro_batch_mean",
        "each micro-batch averages its loss over its own targets, divided by the rank's "
        "micro-batch count (torchtitan before PR 2206, transformers before num_items_in_batch)",
        _per_micro_batch,
        "every micro-batch of every step holds the same number of targets and every rank the same "
        "micro-batches",
    ),
    TokenControl(
        "per_rank_mean",
        "each rank averages its loss over its own targets of the step; DDP averages the ranks "
        "(average_tokens_across_devices false, Megatron#4590)",
        _per_rank,
        "every rank holds the same number of targets in every step",
    ),
    TokenControl(
        "world_size_not_undone",
        "the loss is divided by the step's global target count but not multiplied by "
        "data_parallel_size, so DDP's average leaves the gradient that many times too small "
        "(torchtitan#2318)",
        _world_size_kept,
        "data_parallel_size is 1: DDP's average divides by nothing",
    ),
    TokenControl(
        "boundary_target_counted",
        "the step's target count includes each packed document's first position, which is never a "
        "target (num_items_in_batch before transformers PR 46204)",
        _boundary_counted,
        "no step holds a document",
    ),
)


SYNC_EVERY_MICRO_BATCH = Control(
    "sync_every_micro_batch",
    "an all-reduce after every micro-batch's backward (no no_sync) while ranks run unequal numbers "
    "of micro-batches: the rank that runs out first leaves the others waiting in the all-reduce",
)
_SYNC_HARMLESS = (
    "every rank runs the same number of micro-batches in every step: each all-reduce meets every "
    "peer, and the averaged micro-batch gradients add up to the step's (slower, not wrong)"
)


@dataclass
class _Packed:
    workload: PackedWorkload
    module: torch.nn.Module
    model: DistributedDataParallel
    local: range
    counts: list[Counts]  # per step: replica -> (targets, targets + documents) per micro-batch
    global_targets: list[int] = field(default_factory=list)
    grad: torch.Tensor | None = None
    control_grads: list[tuple[Control, torch.Tensor | None]] = field(default_factory=list)  # None: hung
    skipped: list[SkippedControl] = field(default_factory=list)
    reference: torch.Tensor | None = None
    run_control: ControlOutcome | SkippedControl | None = None  # lr_rescaled_per_batch, on rank 0


class PackedTokenStep:
    """Packed rows or token-budget micro-batches, token-normalised over each step's targets."""

    name: ClassVar[str] = "tokens"
    stage: ClassVar[Stage] = "step"
    laps: ClassVar[Laps] = Laps()

    def applies(self, spec: CheckSpec) -> bool:
        return spec.workload == "tokens" and spec.packing is not None

    def prepare(self, ctx: Context) -> _Packed:
        spec, group = ctx.spec, ctx.group
        refuse_packed(spec)
        workload = PackedWorkload(spec)
        dp = spec.data_parallel_size
        module = workload.module(ctx.dtype, ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=device_ids)
        counts = [
            {
                r: [(targets(b), targets(b) + documents(b)) for b in workload.micro_batches[(s, r)]]
                for r in range(dp)
            }
            for s in range(PACKED_STEPS)
        ]
        ctx.timer.lap("data")
        local = replica_range(group.rank, group.world, dp)
        return _Packed(workload, module, model, local, counts)

    def _batches(self, state: _Packed, step: int, scale: Scale) -> list[Batch]:
        counts = state.counts[step]
        return [
            ([step, r, k], float(scale(r, k, counts)), "sum")
            for r in state.local
            for k in range(len(counts[r]))
        ]

    def plan(self, ctx: Context, state: _Packed) -> None:
        dp, feed = ctx.spec.data_parallel_size, ctx.feed(state.workload)
        grads = []
        for step, counts in enumerate(state.counts):
            n = _all_reduced_targets(counts, state.local, ctx.device)
            state.global_targets.append(n)
            grads.append(ddp_gradient(state.model, self._batches(state, step, _exact(dp, n)), feed))
        state.grad = torch.cat(grads)

    def controls(self, ctx: Context, state: _Packed) -> None:
        applicable, state.skipped = partition(
            PACKED_CONTROLS,
            lambda c: None if any(changes_gradient(c.scale, n) for n in state.counts) else c.harmless_when,
        )
        feed = ctx.feed(state.workload)
        per_step = [
            weighted_gradients(state.module, [self._batches(state, s, c.scale) for c in applicable], feed)
            for s in range(PACKED_STEPS)
        ]
        state.control_grads = [
            (c, torch.cat([grads[i] for grads in per_step])) for i, c in enumerate(applicable)
        ]
        self._sync_every_micro_batch(ctx, state)

    def _sync_every_micro_batch(self, ctx: Context, state: _Packed) -> None:
        """The mistaken loop's collectives in the first step whose ranks run unequal micro-batch
        counts: one all-reduce of the gradient's size after each of the rank's micro-batches, on a
        throwaway group whose timeout ends the wait of the ranks left behind."""
        world, dp = ctx.group.world, ctx.spec.data_parallel_size
        per_rank = [
            [sum(len(counts[r]) for r in replica_range(p, world, dp)) for p in range(world)]
            for counts in state.counts
        ]
        unequal = next((s for s, ranks in enumerate(per_rank) if len(set(ranks)) > 1), None)
        if unequal is None:
            state.skipped.append(SkippedControl(SYNC_EVERY_MICRO_BATCH.name, _SYNC_HARMLESS))
            return
        size = sum(p.numel() for p in state.module.parameters())

        def step(group: dist.ProcessGroup) -> None:
            for _ in range(per_rank[unequal][ctx.group.rank]):
                dist.all_reduce(torch.zeros(size), group=group)

        hung = hangs(step, HANG_TIMEOUT_S)
        # A loop that did not hang met every peer each time: its averages add up to the plan's step.
        state.control_grads.append((SYNC_EVERY_MICRO_BATCH, None if hung else state.grad))

    def measure(self, ctx: Context, state: _Packed) -> bool:
        return False

    def reference(self, ctx: Context, state: _Packed) -> None:
        state.reference = torch.cat(
            [state.workload.reference_gradient(s, ctx.dtype, ctx.device) for s in range(PACKED_STEPS)]
        )
        state.run_control = lr_rescaled_outcome(ctx.spec, state.workload, state.counts)

    def result(self, ctx: Context, state: _Packed, prior: CheckResult | None) -> CheckResult:
        assert state.grad is not None and state.reference is not None
        measured = Measured(
            state.grad,
            state.reference,
            state.control_grads,
            state.skipped,
            [],
            False,
            ctx.spec.micro_batch_sizes(),
        )
        result = judged_result(ctx.spec, ctx.group, state.workload.name, measured)
        run = state.run_control
        if isinstance(run, ControlOutcome):
            return dataclasses.replace(result, controls=(*result.controls, run))
        assert run is not None
        return dataclasses.replace(result, controls_skipped=(*result.controls_skipped, run))


def _exact(dp: int, n: int) -> Scale:
    """The plan's scale: data_parallel_size / N on every micro-batch's target sum."""
    return lambda r, k, counts: Fraction(dp, n)


def _all_reduced_targets(counts: Counts, local: range, device: torch.device) -> int:
    """The step's targets as a training job gets them: each process counts its replicas' micro-
    batches, and an all-reduce sums the counts before the first backward."""
    valid = torch.tensor([sum(c[0] for r in local for c in counts[r])], dtype=torch.int64, device=device)
    dist.all_reduce(valid)
    if int(valid) != _total(counts, 0):
        raise RuntimeError(f"the all-reduced targets {int(valid)} differ from the step's {_total(counts, 0)}")
    return int(valid)
