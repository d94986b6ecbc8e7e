"""The hf-trainer export of packed rows: a collator that hands each micro-batch's rows to
transformers' DataCollatorWithFlattening, the TrainingArguments under which the Trainer's
`num_items_in_batch` is the step's global target count, and the refusal of a token budget.

transformers 5.24 counts `labels[..., 1:] != -100` over the step's gradient_accumulation_steps
micro-batches, sums it over the processes when `average_tokens_across_devices` (and multiplies
the loss by their number, undoing DDP's mean), and hands it to a model whose forward takes
**kwargs, which divides its summed loss by it: the plan's exact scale. The collator flattens a
whole micro-batch into one row and starts each document with the label -100, so a row of
`sequence_length` positions holding d documents has `sequence_length - d` targets, as the plan
counts them.
"""

from __future__ import annotations

from typing import Any

from app.core.errors.domain import InvalidValue
from app.core.exports.parts.export_types import ExportInput
from app.core.records.plan_request import PackingMode, PlanRequest


def require_rows(request: PlanRequest) -> None:
    """A token budget runs a different number of micro-batches on each rank; the Trainer runs
    gradient_accumulation_steps on every one (it has no token-budget batching)."""
    if request.packing is not None and request.packing.mode is PackingMode.TOKEN_BUDGET:
        raise InvalidValue(
            "the hf-trainer export writes packed rows only: the Trainer runs "
            "gradient_accumulation_steps micro-batches of per_device_train_batch_size samples on "
            "every process every step and has no token-budget batching, where a token budget runs "
            "a different number of micro-batches on each rank; plan packing mode rows, or export "
            "python for the budgeted loop",
            pointer="/packing/mode",
        )


def packed_arguments(x: ExportInput) -> tuple[dict[str, Any], dict[str, str]]:
    """(TrainingArguments' values for packed rows, their notes)."""
    p, seq = x.plan, x.request.sequence_length
    values = {"average_tokens_across_devices": True, "use_cache": False}
    notes = {
        "per_device_train_batch_size": f"rows of {seq} positions (pack_rows), x "
        f"{p.gradient_accumulation_steps} accumulation x {p.data_parallel_size} processes = "
        f"{p.global_batch_size} rows a step",
        "average_tokens_across_devices": "num_items_in_batch summed over every process, the loss "
        "times their number: the step's N (False: each process's own count, a mean of rank means)",
        "use_cache": "the Trainer sets model.config.use_cache from it: with a cache, sdpa and eager "
        "attention stop reading document boundaries from position_ids and attend across a row's documents",
    }
    return values, notes


def packed_wrong() -> list[str]:
    """What a plain Trainer(args=training_args) gets wrong for packed rows."""
    return [
        "it collates with its own default collator, not PackedRowsCollator (DataCollatorWithFlattening "
        "over each row's documents, every document's first label -100)",
    ]


PACKED_CODE = '''
SEQUENCE_LENGTH = __SEQ__


def pack_rows(documents, sequence_length: int = SEQUENCE_LENGTH) -> list[list[list[int]]]:
    """Documents (lists of token ids), in order, packed into rows of sequence_length tokens, each
    row the list of its documents: the train_dataset. A document that does not fit is cut at the
    row's end and goes on at the start of the next row, a new document to the collator."""
    rows, row, room = [], [], sequence_length
    for doc in documents:
        while doc:
            piece, doc = doc[:room], doc[room:]
            row.append(piece)
            room -= len(piece)
            if not room:
                rows.append(row)
                row, room = [], sequence_length
    if row:
        rows.append(row)
    return rows


class PackedRowsCollator:
    """A micro-batch of per_device_train_batch_size rows -> DataCollatorWithFlattening over their
    documents: ONE row of (rows x SEQUENCE_LENGTH) positions, position_ids restarting at each
    document (attention stays within it: sdpa/eager read the boundaries from position_ids with
    use_cache=False), each document's first label -100 (separator_id). A plan row of
    SEQUENCE_LENGTH holding d documents thus holds SEQUENCE_LENGTH - d targets, and the Trainer's
    num_items_in_batch (labels[..., 1:] != -100 over the step's micro-batches, summed over the
    processes) is the step's N. Flash attention: return_flash_attn_kwargs=True gives it cu_seq_lens."""

    def __init__(self) -> None:
        self.flatten = DataCollatorWithFlattening(return_tensors="pt")

    def __call__(self, rows):
        return self.flatten([{"input_ids": doc} for row in rows for doc in row])

'''

PACKED_INIT = """
    def __init__(self, *args, **kwargs) -> None:
        if len(args) < 3:  # Trainer(model, args, data_collator, ...)
            kwargs.setdefault("data_collator", PackedRowsCollator())
        super().__init__(*args, **kwargs)
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func):
            # The Trainer then counts nothing: each micro-batch's mean over its own targets, over
            # the accumulation, weighs a row of many short documents above the plan's.
            raise ValueError("packed rows need a model whose forward takes **kwargs (it receives "
                             "num_items_in_batch) or a compute_loss_func")
"""
