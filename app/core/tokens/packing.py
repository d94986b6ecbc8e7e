"""Packed rows and token budgets: what varies per rank and per step, its bounds, and the tools'
defaults that are not exact.

`packing.mode: rows` packs documents into rows of `sequence_length` positions, as Hugging
Face's DataCollatorWithFlattening does: each document's first position is never a target, so a
row holding d documents has `sequence_length - d` targets. `token_budget` fills each
micro-batch, in order, with variable-length samples (at most `sequence_length` tokens each) up
to `max_tokens_per_micro_batch` tokens, a new micro-batch when the next sample would pass it;
a rank then runs a different number of micro-batches from its peers. Either way the exact
gradient is that of the step's summed per-target loss over its global target count N: each
rank sums, multiplies by data_parallel_size (DDP averages) and divides by N, all-reduced before
the first backward; micro-batch counts may differ, with one synchronised backward a step.
"""

from __future__ import annotations

from app.core.errors.domain import InvalidValue
from app.core.records.plan import Plan
from app.core.records.plan_request import LossNormalization, PackingMode, PackingSpec, PlanRequest

_BUDGET = "/packing/max_tokens_per_micro_batch"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def longest_document(packing: PackingSpec, sequence_length: int) -> int:
    """The most tokens one document (a sample, or a row's piece) may hold: a packed row cuts
    a longer document, a budgeted sample is at most sequence_length."""
    known = packing.document_length.max if packing.document_length else None
    return min(known, sequence_length) if known is not None else sequence_length


def check_packing(request: PlanRequest) -> None:
    """Refuses, at the field, a `packing` that contradicts the rest of the request."""
    packing = request.packing
    if packing is None:
        return
    seq = request.sequence_length
    if seq is None:
        raise InvalidValue(
            "packing counts tokens: give sequence_length (the row length, or the longest sample "
            "under a token budget)",
            pointer="/sequence_length",
        )
    if request.loss_normalization is not LossNormalization.TOKEN:
        raise InvalidValue(
            "packing weighs targets, not samples: a packed or budgeted micro-batch holds an "
            "unequal number of targets, and a mean per micro-batch or per rank is not the step's "
            "mean; give loss_normalization token",
            pointer="/loss_normalization",
        )
    lengths = packing.document_length
    if (
        lengths is not None
        and lengths.mean is not None
        and lengths.max is not None
        and lengths.mean > lengths.max
    ):
        raise InvalidValue(
            f"document_length.mean {lengths.mean:g} is above document_length.max {lengths.max}",
            pointer="/packing/document_length/mean",
            suggestions={"packing.document_length.mean": [lengths.max]},
        )
    budget = packing.max_tokens_per_micro_batch
    if packing.mode is PackingMode.ROWS:
        if budget is not None:
            raise InvalidValue(
                "max_tokens_per_micro_batch is the token budget of mode token_budget; packed rows "
                "hold micro_batch_size rows of sequence_length positions",
                pointer=_BUDGET,
            )
        return
    _check_budget(packing, seq, budget)


def _check_budget(packing: PackingSpec, seq: int, budget: int | None) -> None:
    lengths = packing.document_length
    if lengths is not None and lengths.max is not None and lengths.max > seq:
        raise InvalidValue(
            f"document_length.max {lengths.max} is above sequence_length {seq}, the longest "
            "sample under a token budget",
            pointer="/packing/document_length/max",
            suggestions={"packing.document_length.max": [seq]},
        )
    longest = longest_document(packing, seq)
    if budget is None:
        raise InvalidValue(
            "mode token_budget needs max_tokens_per_micro_batch, the tokens a micro-batch is filled up to",
            pointer=_BUDGET,
            suggestions={"packing.max_tokens_per_micro_batch": [longest]},
        )
    if budget < longest:
        raise InvalidValue(
            f"max_tokens_per_micro_batch {budget} is below the longest sample ({longest} tokens), "
            "which would fit no micro-batch",
            pointer=_BUDGET,
            suggestions={"packing.max_tokens_per_micro_batch": [longest]},
        )


def _most_samples_per_replica(plan: Plan) -> int:
    return max(group.samples_per_step for group in plan.replica_groups)


def bounds(packing: PackingSpec, seq: int, plan: Plan) -> tuple[int, int]:
    """(max_valid_targets_per_step, max_micro_batches_per_step), as the collator counts targets."""
    G, longest = plan.global_batch_size, longest_document(packing, seq)
    if packing.mode is PackingMode.ROWS:
        # A full row of seq positions holds at least ceil(seq / longest) documents; a row that is
        # not full holds fewer targets still (p - ceil(p / longest) grows with p).
        return G * (seq - _ceil_div(seq, longest)), plan.gradient_accumulation_steps
    budget = packing.max_tokens_per_micro_batch
    assert budget is not None  # check_packing
    n = _most_samples_per_replica(plan)
    # Every micro-batch but a rank's last holds more than budget - longest tokens (else the next
    # sample would have fitted), and the rank holds at most n x longest tokens.
    most = n if budget == longest else min(n, _ceil_div(n * longest, budget - longest))
    return G * (longest - 1), max(1, most)


def varies(packing: PackingSpec) -> tuple[str, ...]:
    if packing.mode is PackingMode.ROWS:
        return (
            "valid targets per row: a row of sequence_length positions holding d documents has "
            "sequence_length - d",
            "valid targets per micro-batch, per rank and per step",
        )
    return (
        "samples and tokens per micro-batch (filled up to max_tokens_per_micro_batch)",
        "micro-batches per rank per step",
        "valid targets per micro-batch, per rank and per step",
    )


def loss_scale_formula(packing: PackingSpec, dp: int, most_targets: int, most_micro: int) -> str:
    per_step = (
        "every micro-batch of the step (from 1 to "
        f"{most_micro} a rank, all but the last under no_sync, one synchronised backward)"
        if packing.mode is PackingMode.TOKEN_BUDGET
        else f"all {most_micro} micro-batches of the step"
    )
    return (
        f"sum of per-target losses over valid targets x {dp} (data_parallel_size) / N, N = the step's "
        f"valid targets over {per_step} all-reduced over {dp} ranks before the first backward "
        f"(N <= {most_targets})"
    )
