"""The plan request's `packing`: packed rows or token budgets (app.core.tokens.packing)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from app.core.records import plan_request as core
from app.schemas.types import RequestModel, plan_limit, with_examples


class DocumentLengthIn(RequestModel):
    model_config = with_examples({"mean": 900.0, "max": 4096})

    mean: Annotated[float, plan_limit("packing.document_length.mean")] | None = Field(
        None, description="Tokens per document on average: the plan says what share of positions are targets."
    )
    max: Annotated[int, plan_limit("packing.document_length.max")] | None = Field(
        None,
        description="The longest document, in tokens: bounds the documents a row holds "
        "(max_valid_targets_per_step) and, under a budget, the micro-batches a rank runs.",
    )


class PackingIn(RequestModel):
    """Packed rows or token budgets: each rank holds a different number of valid targets every
    step (and, under a budget, a different number of micro-batches): docs/tokens.md."""

    model_config = with_examples({"mode": "rows", "document_length": {"mean": 900.0, "max": 4096}})

    mode: core.PackingMode = Field(
        description="rows: documents packed into rows of sequence_length positions (Hugging Face's "
        "DataCollatorWithFlattening; a document's first position is never a target, attention stays "
        "within each document). token_budget: variable-length samples of at most sequence_length "
        "tokens, each micro-batch filled in order up to max_tokens_per_micro_batch."
    )
    max_tokens_per_micro_batch: Annotated[int, plan_limit("packing.max_tokens_per_micro_batch")] | None = (
        Field(
            None,
            description="The token budget of a micro-batch; mode token_budget only (and required there).",
            examples=[16384],
        )
    )
    document_length: DocumentLengthIn | None = Field(
        None, description="What is known of the documents' lengths."
    )
