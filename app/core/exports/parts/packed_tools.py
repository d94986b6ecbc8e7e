"""The megatron and torchtitan exports of packed rows: the settings that keep each document's
positions, attention and targets its own, the notes on how each tool normalises the step's
token loss (and where torchtitan 0.2.2 does not), and the refusal of a token budget, which
neither tool batches by.

Megatron-core 0.16.1's GPTDataset concatenates documents, each ending in the tokenizer's EOD,
into rows of seq_length + 1 tokens and pre-shifts the labels; `--eod-mask-loss` drops the target
of every EOD input (the next document's first token), so a row of seq_length inputs holding d
EODs has seq_length - d targets: the plan's count of a row holding d documents.
`--calculate-per-token-loss` back-propagates each micro-batch's summed loss and divides the
gradients by the step's target count all-reduced over the data-parallel group
(finalize_model_grads): the plan's exact scale. torchtitan 0.2.2 divides each micro-batch's
summed loss by the step's global valid-token count (train.py, PR #2206) with no setting, but its
pure DDP still averages (torchtitan#2318) and its pipeline schedule back-propagates the raw sum
(torchtitan#2972).
"""

from __future__ import annotations

from app.core.errors.domain import InvalidValue
from app.core.exports.parts.export_types import ExportInput
from app.core.records.plan_request import PackingMode, PlanRequest

_NO_BUDGET = {
    "megatron": "Megatron-LM takes one --micro-batch-size and runs global / (micro x data-parallel "
    "size) micro-batches on every rank",
    "torchtitan": "torchtitan's dataloader packs documents into training.local_batch_size rows of "
    "seq_len tokens on every rank",
}


def refuse_budget(fmt: str, request: PlanRequest) -> None:
    """A token budget runs a different number of micro-batches on each rank; `fmt`'s tool runs
    the same count on every one."""
    if fmt in _NO_BUDGET and request.packing is not None and request.packing.mode is PackingMode.TOKEN_BUDGET:
        raise InvalidValue(
            f"the {fmt} export writes packed rows only: {_NO_BUDGET[fmt]} and has no token-budget "
            "batching, where a token budget runs a different number of micro-batches on each rank; "
            "plan packing mode rows, or export python for the budgeted loop",
            pointer="/packing/mode",
        )


def megatron_packed(x: ExportInput) -> tuple[list[tuple[str, ...]], list[str]]:
    """Megatron's packed-row arguments and their notes; none for an unpacked plan."""
    if x.request.packing is None:
        return [], []
    refuse_budget("megatron", x.request)
    args: list[tuple[str, ...]] = [
        ("--reset-position-ids",),
        ("--reset-attention-mask",),
        ("--eod-mask-loss",),
    ]
    notes = [
        "packed rows: GPTDataset packs documents, each ending in the tokenizer's EOD, into rows of "
        "--seq-length inputs; --reset-position-ids and --reset-attention-mask keep each document's "
        "positions and attention its own, --eod-mask-loss drops the target after each EOD (the next "
        "document's first token): a row holding d documents has seq_length - d targets, as the plan counts",
        "--calculate-per-token-loss: each micro-batch's summed loss, and the gradients divided by the "
        "step's target count all-reduced over the data-parallel group; without it Megatron averages "
        "micro-batch means, not the step's token mean (Megatron-LM#4590)",
    ]
    return args, notes


def torchtitan_packed_notes(x: ExportInput) -> list[str]:
    """What torchtitan 0.2.2 does with packed rows, and where its gradient is not the plan's."""
    if x.request.packing is None:
        return []
    refuse_budget("torchtitan", x.request)
    notes = [
        "packed rows: torchtitan's dataloader packs documents into rows of seq_len with pre-shifted "
        "labels and no -100 at a boundary, so its count N is seq_len a row (the target across each "
        "document boundary too), d more than the plan's seq_len - d; attention stays within a "
        "document only in a model flavor with attn_mask_type block_causal (llama3 8B_flex, 8B_varlen)",
    ]
    mesh, dp = x.plan.device_mesh, x.plan.data_parallel_size
    if dp > 1 and (mesh is None or mesh.data_parallel_shard == 1):
        notes.append(
            f"pure DDP (data_parallel_replicate_degree {dp}, no shard): torchtitan 0.2.2's replicate "
            f"still averages the gradients over the {dp} replicas, so they come out {dp} times too "
            f"small (torchtitan#2318): shard instead (data_parallel_shard_degree, whose gradient "
            f"divide factor torchtitan sets to 1), or multiply the loss by {dp}"
        )
    if x.request.parallelism.pipeline > 1:
        notes.append(
            "pipeline_parallel_degree above 1: torchtitan 0.2.2's schedule back-propagates the summed "
            "loss undivided (scale_grads=False), so the gradients are the step's valid-token count "
            "times too large (torchtitan#2972): divide them by it before the optimizer step"
        )
    return notes
