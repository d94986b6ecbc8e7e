"""The plan's `max_valid_targets_per_step` against the real Hugging Face collator: documents of
seeded random lengths packed into rows go through transformers' DataCollatorWithFlattening, and
the targets are counted as the 5.x Trainer counts num_items_in_batch for a causal model
(`labels[..., 1:] != -100`): a row holding d documents has sequence_length - d, never above the
plan's bound, which full rows of the longest documents reach."""

from __future__ import annotations

import random

import pytest

from app.core.planner import plan
from app.core.records.plan_request import (
    DocumentLength,
    LossNormalization,
    PackingMode,
    PackingSpec,
    PlanRequest,
    Topology,
)

SEQ, LONGEST = 64, 20


def _rows(lengths: list[int]) -> list[list[int]]:
    """Documents packed in order into rows of SEQ positions, one cut at a row's end going on as
    a new document in the next row (the collator sees each piece as an example)."""
    rows: list[list[int]] = [[]]
    for length in lengths:
        left = length
        while left:
            room = SEQ - sum(rows[-1]) or SEQ
            if room == SEQ and rows[-1]:
                rows.append([])
            piece = min(room, left)
            rows[-1].append(piece)
            left -= piece
    return rows


def test_the_bound_is_what_the_collator_counts_at_most() -> None:
    transformers = pytest.importorskip("transformers")
    request = PlanRequest(
        topology=Topology.homogeneous(1, 2),
        global_batch_size=8,
        micro_batch_size=2,
        sequence_length=SEQ,
        loss_normalization=LossNormalization.TOKEN,
        packing=PackingSpec(PackingMode.ROWS, document_length=DocumentLength(max=LONGEST)),
    )
    tokens = plan(request).tokens
    assert tokens is not None and tokens.max_valid_targets_per_step == 8 * (SEQ - 4)  # ceil(64 / 20)
    collate = transformers.DataCollatorWithFlattening()
    rng = random.Random(0)
    lengths = [rng.randint(2, LONGEST) for _ in range(300)] + [LONGEST] * 16  # full rows of the longest
    rows = [row for row in _rows(lengths) if sum(row) == SEQ]
    most = 0
    for row in rows:
        batch = collate([{"input_ids": list(range(1, n + 1))} for n in row])
        assert tuple(batch["input_ids"].shape) == (1, SEQ)
        counted = int((batch["labels"][..., 1:] != -100).sum())  # the Trainer's num_items_in_batch
        assert counted == SEQ - len(row)
        most = max(most, counted)
    assert most * 8 == tokens.max_valid_targets_per_step
