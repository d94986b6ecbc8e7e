"""A plan request's `dataset` (DatasetIn): a map-style dataset, DistributedSampler's, or a stream
(docs/streams.md). Its form is refused by the core's own rule (app.core.request.dataset)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from app.core.request.dataset import dataset_form
from app.schemas.types import RequestModel, plan_limit, with_examples

ShardCount = Annotated[int, plan_limit("dataset.shard_samples[]")]


class DatasetIn(RequestModel):
    """A map-style dataset (kind "map", the default: DistributedSampler splits it) or a stream
    (kind "stream": an IterableDataset in shards that the splitter shares out over the ranks
    and their DataLoader workers; docs/streams.md). The fields from num_shards on are a
    stream's."""

    model_config = with_examples(
        {"num_samples": 1281167, "shuffle": True, "seed": 0, "drop_last": False, "epochs": 90},
        {
            "kind": "stream",
            "num_samples": 4096,
            "num_shards": 16,
            "splitter": "hf_datasets",
            "num_workers": 2,
            "end_of_epoch": "drop",
        },
    )

    kind: Literal["map", "stream"] = Field(
        "map", description='"map": a map-style dataset, DistributedSampler\'s; "stream": an IterableDataset.'
    )
    num_samples: Annotated[int, plan_limit("dataset.num_samples")] | None = Field(
        None,
        description="Every sample; required on a map. A stream gives this (shared out over num_shards as "
        "Dataset.to_iterable_dataset(num_shards) does: contiguous, the first num_samples % num_shards "
        "shards one larger) or shard_samples.",
    )
    shuffle: bool | None = Field(
        None,
        strict=True,
        description="Default true on a map (the sampler's), false on a stream; on a stream true "
        "shuffles the shard order each epoch by seed, the same on every rank.",
    )
    seed: Annotated[int, plan_limit("dataset.seed")] = 0
    drop_last: bool = Field(False, strict=True, description="DistributedSampler's; a map's only.")
    epochs: Annotated[int, plan_limit("dataset.epochs")] | None = None
    num_shards: Annotated[int, plan_limit("dataset.num_shards")] | None = Field(
        None, description="A stream's shards (default: the length of shard_samples)."
    )
    shard_samples: Annotated[list[ShardCount], plan_limit("dataset.shard_samples")] | None = Field(
        None, description="A stream's samples in each shard, num_shards counts: instead of num_samples."
    )
    splitter: Literal["hf_datasets", "webdataset", "rank_worker"] | None = Field(
        None,
        description="Who splits the stream: datasets' split_dataset_by_node (then the node's shards over "
        "its workers), WebDataset's split_by_node then split_by_worker, or shards dealt round-robin "
        "to the reader rank x num_workers + worker. Required on a stream: without one every rank "
        "reads the whole stream.",
    )
    num_workers: Annotated[int, plan_limit("dataset.num_workers")] | None = Field(
        None, description="A stream's DataLoader workers per rank (default 0: the rank reads itself)."
    )
    end_of_epoch: Literal["drop", "pad", "cycle", "steps"] | None = Field(
        None,
        description="What ranks of unequal micro-batch counts do (default drop): drop (all stop at the "
        "fewest), pad (the short repeat their first samples), cycle (a finished rank starts its "
        "stream again until all have finished), steps (the stream repeats; the run is "
        "learning_rate.train_steps).",
    )

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        wrong = dataset_form({name: value for name, value in vars(self).items() if value is not None})
        if wrong is not None:
            raise ValueError(wrong)
        return self
