"""The flags of a streaming dataset (`--stream` and its fields: docs/streams.md), which
options.BatchFlags takes for plan, export and check."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.help_panels import DATA

StreamFlag = Annotated[
    bool,
    typer.Option(
        "--stream",
        help="The dataset is a stream (an IterableDataset in shards; dataset.kind stream, docs/streams.md).",
        show_default=False,
        rich_help_panel=DATA,
    ),
]
NumShards = Annotated[
    int | None, typer.Option(help="Stream: its shards (dataset.num_shards).", rich_help_panel=DATA)
]
ShardSamples = Annotated[
    str | None,
    typer.Option(
        metavar="N,N,...",
        help="Stream: each shard's samples, instead of --num-samples.",
        rich_help_panel=DATA,
    ),
]
Splitter = Annotated[
    str | None,
    typer.Option(
        metavar="hf_datasets|webdataset|rank_worker",
        help="Stream: who splits it over ranks and workers.",
        rich_help_panel=DATA,
    ),
]
NumWorkers = Annotated[
    int | None, typer.Option(help="Stream: DataLoader workers per rank (default: 0).", rich_help_panel=DATA)
]
EndOfEpoch = Annotated[
    str | None,
    typer.Option(
        metavar="drop|pad|cycle|steps",
        help="Stream: what ranks of unequal counts do (default: drop).",
        rich_help_panel=DATA,
    ),
]
