"""The flags of packed rows and token budgets (`plan` and `export`: the request's `packing`,
docs/tokens.md), declared once as a flag group (flag_groups.py), and the request they add."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from app.cli.help_panels import BATCH
from app.client import Json
from app.core.records.plan_request import PackingMode

Packing = Annotated[
    PackingMode | None,
    typer.Option(
        help="rows: documents packed into rows of --sequence-length (DataCollatorWithFlattening); "
        "token_budget: samples of at most --sequence-length filled up to --max-tokens-per-micro-batch. "
        "Needs --loss-normalization token.",
        rich_help_panel=BATCH,
    ),
]
MaxTokensPerMicroBatch = Annotated[
    int | None,
    typer.Option(
        help="--packing token_budget: the tokens a micro-batch is filled up to.", rich_help_panel=BATCH
    ),
]
DocumentLengthMean = Annotated[
    float | None,
    typer.Option(help="--packing: tokens per document on average, when known.", rich_help_panel=BATCH),
]
DocumentLengthMax = Annotated[
    int | None,
    typer.Option(
        help="--packing: the longest document in tokens, when known (tightens the bounds).",
        rich_help_panel=BATCH,
    ),
]


@dataclass(frozen=True)
class PackingFlags:
    """`plan` and `export`: packed rows or a token budget (the request's `packing`)."""

    packing: Packing = None
    max_tokens_per_micro_batch: MaxTokensPerMicroBatch = None
    document_length_mean: DocumentLengthMean = None
    document_length_max: DocumentLengthMax = None


def with_packing(body: Json, flags: PackingFlags) -> Json:
    """`body` with the `packing` the flags ask for (unchanged without --packing; a budget or
    document length without it is left to the schema to refuse, at its flag)."""
    given = {
        "max_tokens_per_micro_batch": flags.max_tokens_per_micro_batch,
        "document_length": {
            k: v
            for k, v in (("mean", flags.document_length_mean), ("max", flags.document_length_max))
            if v is not None
        }
        or None,
    }
    packing: Json = {k: v for k, v in given.items() if v is not None}
    if flags.packing is None and not packing:
        return body
    if flags.packing is not None:
        packing["mode"] = flags.packing.value
    return {**body, "packing": packing}
