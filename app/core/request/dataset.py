"""A plan request's `dataset` as JSON to the core's DatasetSpec and back: a map-style dataset
(DistributedSampler's) or a stream (app.core.split.stream), each refused at /dataset where its
form is wrong, the same rule the HTTP schema applies (app.schemas.dataset_in)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from app.core.errors.domain import InvalidValue
from app.core.records import plan_request as core


def as_mapping(data: Mapping[str, Any] | object) -> Mapping[str, Any]:
    """A JSON object, or the validated schema model the HTTP layer hands over (its vars())."""
    return data if isinstance(data, Mapping) else vars(data)


# A stream's own fields: on a map-style dataset (DistributedSampler's) they would mean nothing.
STREAM_FIELDS = ("num_shards", "shard_samples", "splitter", "num_workers", "end_of_epoch")


def dataset_form(given: Mapping[str, Any]) -> str | None:
    """What is wrong with the form of a `dataset` (its non-null fields), or None: a map with a
    stream's field or without num_samples, a stream with drop_last or not sized by exactly one of
    num_samples and shard_samples, or with neither num_shards nor shard_samples. The HTTP schema
    refuses the same at /dataset (app.schemas.dataset_in.DatasetIn); the stream's planner
    checks the rest (app.core.split.stream.checks)."""
    if given.get("kind", "map") == "map":
        stray = next((name for name in STREAM_FIELDS if name in given), None)
        if stray is not None:
            return f'{stray} describes a stream: give kind "stream" too'
        return None if "num_samples" in given else "a map-style dataset needs num_samples"
    if given.get("drop_last"):
        return "drop_last is DistributedSampler's: a stream's epoch ends by end_of_epoch"
    if ("shard_samples" in given) == ("num_samples" in given):
        return (
            "a stream takes one of num_samples (shared out over num_shards) and shard_samples (each shard's)"
        )
    if "num_shards" not in given and "shard_samples" not in given:
        return "a stream sized by num_samples needs num_shards"
    return None


def dataset_spec(body: Mapping[str, Any] | object) -> core.DatasetSpec:
    """The request's `dataset`: a map-style dataset (the default) or a stream."""
    given = {name: value for name, value in as_mapping(body).items() if value is not None}
    if given.get("kind", "map") not in ("map", "stream"):  # JSON the HTTP schema did not read
        raise InvalidValue('kind is "map" or "stream"', pointer="/dataset/kind")
    wrong = dataset_form(given)
    if wrong is not None:
        raise InvalidValue(wrong, pointer="/dataset")
    if given.pop("kind", "map") == "map":
        return core.DatasetSpec(**given)
    listed = given.get("shard_samples")
    if listed is not None:
        given["shard_samples"] = listed = tuple(int(n) for n in listed)
        given["num_samples"] = sum(listed)
        given.setdefault("num_shards", len(listed))
    given.setdefault("shuffle", False)  # a stream's order is its shards' unless asked
    return core.DatasetSpec(kind="stream", **given)


def dataset_json(dataset: core.DatasetSpec, json_of: Callable[[Any], Any]) -> dict[str, Any]:
    """`dataset` as the request gives it (each value written by `json_of`): a map without the
    stream's fields, a stream asked by shard_samples without their sum."""
    data = {f.name: json_of(getattr(dataset, f.name)) for f in fields(dataset)}
    if dataset.kind == "map":
        drop: tuple[str, ...] = ("kind", *STREAM_FIELDS)
    else:
        drop = ("drop_last",) + (("num_samples",) if dataset.shard_samples is not None else ())
    return {name: value for name, value in data.items() if value is not None and name not in drop}
