"""A stream check over HTTP: what the result says of a stream plan's epoch (StreamCheckOut;
app.contract.kinds.stream writes it) and its Swagger example. A check request takes no option
for it: a plan whose dataset is a stream is checked so."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field


class StreamRanksOut(BaseModel):
    rank: int = Field(description="The first data-parallel rank of these consecutive ranks.")
    stop: int = Field(
        description="One past the last (ranks with equal figures merged, as the plan's rank_groups)."
    )
    samples: int = Field(description="Samples each of them trained in the epoch, repeats included.")
    micro_batches: int = Field(description="Micro-batches each trained, short last ones included.")


class SampleCountsOut(BaseModel):
    seen_once: int
    seen_more: int
    missing: int


class StreamCheckOut(BaseModel):
    """A stream plan's epoch as the ranks read it: real DataLoader worker processes over the
    splitter's real IterableDataset, each rank recording the sample ids it trained."""

    splitter: str = Field(description="The plan's splitter, run as the library runs it.")
    ranks: list[StreamRanksOut] = Field(description="Per rank, what it trained in the epoch.")
    seen_once: int = Field(description="Samples of the stream trained exactly once.")
    seen_more: int = Field(description="Samples trained more than once (pad and cycle repeat some).")
    missing: int = Field(description="Samples never trained (drop leaves some).")
    predicted: SampleCountsOut = Field(description="The same three counts as the plan predicts them.")
    matches_plan: bool = Field(
        description="Every rank trained exactly the plan's micro-batches, in the order its DataLoader "
        "delivered them (passed requires it)."
    )
    optimizer_steps: int = Field(
        description="Optimizer steps trained, each one's gradient held against "
        "the single-process mean over the same samples."
    )
    worst_step: int = Field(
        description="The step (from 0) whose gradient is the result's `gradient`: the "
        "furthest from its reference."
    )
    loader_workers: int = Field(
        description="DataLoader worker processes each reading of the stream started (ranks x num_workers)."
    )


# The field of CheckResultOut, one line there.
StreamResultField = Annotated[
    StreamCheckOut | None,
    Field(
        description="A stream plan (dataset kind stream): what each rank read and trained of the epoch, "
        "against the plan's prediction; its controls are no_rank_split, no_worker_split, "
        "same_reader_index, unseeded_shuffle and no_end_of_epoch_policy (a hang, detected).",
    ),
]

EXAMPLES: dict[str, dict[str, Any]] = {
    "stream": {
        "summary": "A stream over 2 ranks with 2 DataLoader workers each (WebDataset's split)",
        "description": "Every rank reads the stream through real DataLoader worker processes and "
        "WebDataset's split_by_node and split_by_worker, records the samples it trains, and holds "
        "every step's gradient to the single-process mean over the same samples; the result's "
        "`stream` says what each rank trained against the plan.",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 2},
                "global_batch_size": 16,
                "micro_batch_size": 8,
                "dataset": {
                    "kind": "stream",
                    "num_samples": 128,
                    "num_shards": 8,
                    "splitter": "webdataset",
                    "num_workers": 2,
                },
            },
            "dtype": "float64",
        },
    },
}
