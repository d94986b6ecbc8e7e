"""The packed check's run-level control `lr_rescaled_per_batch`: DeepSpeed's dynamic batching
(PR 7104, deepspeed 0.19.8 variable_batch_size_and_lr.py) keeps each micro-batch's mean loss,
divided by the engine's accumulation steps and averaged by DDP, and instead scales each step's
lr by how much the step holds over the configured batch (its linear rule). Over the check's
seeded steps, trained one after another with plain SGD from the same weights, its parameters
are held against the run whose every step takes the mean over the step's valid targets.

The step's size is its tokens over the plan's tokens_per_step (global_batch_size x
sequence_length), as the issue states the mistake. DeepSpeed 0.19.8 itself counts sequences,
but the check's steps each hold the plan's samples (a budget fills micro-batches, not steps),
so a multiplier of samples would be 1 here and leave only the micro-batch means to detect.

The two runs agree only where every micro-batch of every step holds as many targets as every
other and each step the plan's tokens; everywhere else the lr multiplier rescales the whole step
but cannot re-weigh the targets within it.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from app.contract.check_result import ControlOutcome, SkippedControl
from app.contract.spec import CheckSpec
from app.worker.checks.controls import Control
from app.worker.checks.result_parts import DETECTION_FACTOR, TOLERANCE
from app.worker.checks.token_check import Counts, Scale, changes_gradient
from app.worker.training.gradients import compare
from app.worker.training.packed_model import PackedWorkload, packed_loss
from app.worker.training.synthetic_model import backward

LR_RESCALED_PER_BATCH = Control(
    "lr_rescaled_per_batch",
    "each micro-batch's mean loss over its own targets, divided by the accumulation steps and "
    "averaged over the ranks, with each step's lr scaled by its tokens over the plan's tokens per "
    "step (DeepSpeed's dynamic batching, PR 7104: the lr rescaled instead of the loss weighted)",
)
_HARMLESS = (
    "every micro-batch of every step holds the same number of targets and every step the plan's "
    "tokens: the lr multiplier is 1 and each micro-batch's mean weighs its targets as the step's does"
)
RUN_LR = 0.1  # plain SGD: the update is the lr times the gradient, so the runs differ by their weights


def _tokens(counts: Counts) -> int:
    """The step's tokens: every position of every micro-batch (its targets and its documents' first
    positions)."""
    return sum(c[1] for batches in counts.values() for c in batches)


def rescaled(spec: CheckSpec, counts: Counts) -> Scale:
    """The step's multiplier of each micro-batch's target sum before DDP's average: its mean over
    its targets, over the accumulation steps, times the step's lr multiplier."""
    assert spec.sequence_length is not None
    multiplier = Fraction(_tokens(counts), spec.global_batch_size * spec.sequence_length)
    g = spec.gradient_accumulation_steps

    def scale(r: int, k: int, step_counts: Counts) -> Fraction:
        valid = step_counts[r][k][0]
        return multiplier / (g * valid) if valid else Fraction(0)

    return scale


def _exact(dp: int, n: int) -> Scale:
    """The plan's scale: data_parallel_size / N on every micro-batch's target sum."""
    return lambda r, k, counts: Fraction(dp, n)


def harmless_because(spec: CheckSpec, steps: list[Counts]) -> str | None:
    """Why the control leaves this plan's run as it is, or None where it changes it."""
    return None if any(changes_gradient(rescaled(spec, c), c) for c in steps) else _HARMLESS


def _run(workload: PackedWorkload, steps: list[Counts], scales: list[Scale]) -> torch.Tensor:
    """Plain SGD over the steps on one process, each micro-batch's target sum weighted by its
    step's scale over DDP's data_parallel_size; the parameters after the last step."""
    dtype = torch.float64
    module = workload.module(dtype, torch.device("cpu"))
    dp = len(steps[0])
    for step, (counts, scale) in enumerate(zip(steps, scales, strict=True)):
        module.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=dtype)
        for r, batches in counts.items():
            for k in range(len(batches)):
                weight = float(scale(r, k, counts)) / dp
                if weight:
                    total = total + weight * packed_loss(module, workload.micro_batches[(step, r)][k], "sum")
        backward(total)
        with torch.no_grad():
            for p in module.parameters():
                if p.grad is not None:
                    p.sub_(RUN_LR * p.grad)
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def lr_rescaled_outcome(
    spec: CheckSpec, workload: PackedWorkload, steps: list[Counts]
) -> ControlOutcome | SkippedControl:
    """The control's parameters after the steps against the token-mean run's, or why it is skipped.
    Both runs train in float64 on rank 0 alone, whatever the check's dtype: a step moves the
    parameters by far less than their size, so the float32 tolerance would hide the difference."""
    reason = harmless_because(spec, steps)
    if reason is not None:
        return SkippedControl(LR_RESCALED_PER_BATCH.name, reason)
    dp = spec.data_parallel_size
    exact = [_exact(dp, sum(c[0] for batches in counts.values() for c in batches)) for counts in steps]
    reference = _run(workload, steps, exact)
    control = _run(workload, steps, [rescaled(spec, c) for c in steps])
    max_abs, rel = compare(control, reference)
    detected = rel > DETECTION_FACTOR * TOLERANCE["float64"]
    control_name, description = LR_RESCALED_PER_BATCH.name, LR_RESCALED_PER_BATCH.description
    return ControlOutcome(control_name, description, rel, max_abs, detected)
