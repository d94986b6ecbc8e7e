"""Whether a stream can be planned: the fields a plan refuses (InvalidValue, naming the field)
and the rank it will not leave without a sample (InfeasiblePlan, with the least shard count
that gives every rank one)."""

from __future__ import annotations

from app.core.errors.domain import InfeasiblePlan, InvalidValue
from app.core.records.plan_request import MAX_SAFE_INTEGER
from app.core.records.stream import END_OF_EPOCH, SPLITTERS, StreamSpec
from app.core.request.limits import MAX_STREAM_SHARDS
from app.core.split.stream.advice import least_num_shards
from app.core.split.stream.counts import Run
from app.core.split.stream.layout import (
    MAX_COUNTED_SHARDS,
    MAX_STREAM_READERS,
    needs_order,
    total_samples,
)


def check_stream(spec: StreamSpec, world_size: int, epoch: int) -> None:
    """Raise InvalidValue at the first field of the stream outside what can be planned."""
    if spec.splitter is None:
        raise InvalidValue(
            "a stream needs a splitter: the DataLoader takes no sampler for an IterableDataset, so "
            "without one every rank (and every DataLoader worker) reads the whole stream",
            pointer="/dataset/splitter",
        )
    if spec.splitter not in SPLITTERS or spec.end_of_epoch not in END_OF_EPOCH:
        bad = "splitter" if spec.splitter not in SPLITTERS else "end_of_epoch"
        raise InvalidValue(f"unknown {bad}", pointer=f"/dataset/{bad}")
    if not 1 <= spec.num_shards <= MAX_STREAM_SHARDS:
        raise InvalidValue(f"num_shards must lie in 1..{MAX_STREAM_SHARDS}", pointer="/dataset/num_shards")
    _check_sizes(spec)
    if spec.num_workers < 0 or world_size * max(1, spec.num_workers) > MAX_STREAM_READERS:
        raise InvalidValue(
            f"num_workers must be >= 0, and ranks x workers at most {MAX_STREAM_READERS}",
            pointer="/dataset/num_workers",
        )
    if spec.seed < 0:
        raise InvalidValue("seed must be >= 0 (numpy's seeds are)", pointer="/dataset/seed")
    counted = spec.shard_samples is not None or needs_order(spec, epoch)
    if counted and spec.num_shards > MAX_COUNTED_SHARDS:
        raise InvalidValue(
            f"a shard_samples list, or shards of different sizes in a shuffled order, is counted shard "
            f"by shard, up to {MAX_COUNTED_SHARDS} shards; num_samples shared out over up to "
            f"{MAX_STREAM_SHARDS} shards is counted in closed form",
            pointer="/dataset/num_shards",
        )


def _check_sizes(spec: StreamSpec) -> None:
    if (spec.shard_samples is None) == (spec.num_samples is None):
        raise InvalidValue(
            "give exactly one of shard_samples and num_samples", pointer="/dataset/shard_samples"
        )
    if spec.shard_samples is not None:
        if len(spec.shard_samples) != spec.num_shards or min(spec.shard_samples) < 1:
            raise InvalidValue(
                "shard_samples holds num_shards counts, each >= 1", pointer="/dataset/shard_samples"
            )
    elif not spec.num_shards <= (spec.num_samples or 0):
        raise InvalidValue(
            "num_samples must be >= num_shards: to_iterable_dataset cannot make an empty shard",
            pointer="/dataset/num_samples",
        )
    if total_samples(spec) > MAX_SAFE_INTEGER:
        raise InvalidValue(
            f"the stream holds at most {MAX_SAFE_INTEGER} samples", pointer="/dataset/num_samples"
        )


def refuse_empty_ranks(spec: StreamSpec, world_size: int, runs: list[Run]) -> None:
    """InfeasiblePlan where a rank would get no sample: a rank that never steps hangs the rest."""
    empty = [(start, stop) for start, stop, (_, samples) in runs if sum(samples) == 0]
    if not empty:
        return
    least = least_num_shards(spec, world_size)
    why = {
        "webdataset": "split_by_node gives rank r the shards r, r + world_size, ... and wds.WebDataset "
        "raises 'No samples found' in a rank that has none",
        "rank_worker": "reader rank x workers + worker takes the shards g, g + readers, ...",
        "hf_datasets": "num_shards is not a multiple of the ranks, so split_dataset_by_node keeps 1 "
        "sample in world_size of each worker's stream, and these are too short to reach every rank",
    }[spec.splitter or "rank_worker"]
    detail = f"ranks {empty[0][0]}..{empty[-1][1] - 1} would get no sample ({why})"
    if least > total_samples(spec):
        raise InfeasiblePlan(
            f"{detail}; {least} shards of one sample at least would give every rank one",
            pointer="/dataset/num_samples" if spec.shard_samples is None else "/dataset/shard_samples",
        )
    raise InfeasiblePlan(
        f"{detail}; num_shards {least} is the least that gives every rank a shard",
        pointer="/dataset/num_shards",
        suggestions={"dataset.num_shards": [least]},
    )


_STATEFUL = (
    "torchdata's StatefulDataLoader, which saves a loader's state, holds it 'across multiprocess "
    "workers (but not across ranks)' and 'requires StatefulDataLoader to have same num_workers' "
    "(its README; meta-pytorch/data#1437, #1520)"
)
RESUME_REFUSALS = {
    "hf_datasets": "datasets keeps a stream's position per reader (IterableDataset.state_dict: a shard "
    "index into that reader's own shards, after the node and worker split) and checks no world size: "
    "a state saved on other ranks or workers resumes at the wrong place without an error "
    f"(huggingface/datasets#7447, #8308); and {_STATEFUL}. Resume on the same ranks and workers "
    "from the loader's own state_dict, or restart the epoch",
    "webdataset": "WebDataset keeps no position in its shard lists, so its readers start them again; "
    f"{_STATEFUL}. Resume on the same ranks and workers from the loader's own state, skip the "
    "consumed shards yourself, or restart the epoch",
}


def refuse_resume(splitter: str) -> InvalidValue:
    """Why a stream plan's `resume` is refused: these splitters' readers keep their own state
    (rank_worker's resume from a count: app.core.resume.stream_resume)."""
    return InvalidValue(f"a stream plan's resume is refused: {RESUME_REFUSALS[splitter]}", pointer="/resume")
