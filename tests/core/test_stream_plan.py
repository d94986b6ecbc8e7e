"""The stream plan's own rules (app.core.split.stream.plan): the fields it refuses and where, the
rank it will not leave without a sample, the warnings and their sources, the end-of-epoch
policies' counts worked by hand, the suggested shard counts, and its cost at 2**53 - 1 samples
and a million shards. tests/core/test_stream_split.py holds the same plans to the libraries."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import replace

import pytest

from app.core.errors.domain import InfeasiblePlan, InvalidValue
from app.core.records.plan import ReplicaGroup
from app.core.records.plan_request import MAX_SAFE_INTEGER
from app.core.records.stream import StreamSpec
from app.core.request.limits import MAX_STREAM_SHARDS
from app.core.split.stream.advice import least_num_shards
from app.core.split.stream.ids import delivered_micro_batches, trained_micro_batches
from app.core.split.stream.layout import MAX_COUNTED_SHARDS
from app.core.split.stream.plan import plan_stream


def spec(**fields) -> StreamSpec:
    base = {"num_shards": 4, "splitter": "webdataset", "num_samples": 40}
    return StreamSpec(**(base | fields))


@pytest.mark.parametrize(
    ("fields", "world_size", "pointer", "words"),
    [
        ({"splitter": None}, 2, "/dataset/splitter", "every rank"),
        ({"shard_samples": (10, 10, 10, 10)}, 2, "/dataset/shard_samples", "exactly one"),
        ({"num_samples": None}, 2, "/dataset/shard_samples", "exactly one"),
        ({"num_samples": None, "shard_samples": (1, 2, 3)}, 2, "/dataset/shard_samples", "num_shards counts"),
        ({"num_samples": None, "shard_samples": (1, 2, 0, 3)}, 2, "/dataset/shard_samples", ">= 1"),
        ({"num_samples": 3}, 2, "/dataset/num_samples", "empty shard"),
        ({"num_samples": MAX_SAFE_INTEGER + 1}, 2, "/dataset/num_samples", "at most"),
        ({"num_shards": 0}, 2, "/dataset/num_shards", "1.."),
        ({"num_shards": MAX_STREAM_SHARDS + 1, "num_samples": 10**7}, 2, "/dataset/num_shards", "1.."),
        ({"num_workers": -1}, 2, "/dataset/num_workers", ">= 0"),
        ({"num_workers": 8}, 200_000, "/dataset/num_workers", "ranks x workers"),
        ({"seed": -1}, 2, "/dataset/seed", ">= 0"),
        ({"end_of_epoch": "wrap"}, 2, "/dataset/end_of_epoch", "unknown"),
    ],
)
def test_each_field_out_of_range_is_named(fields, world_size: int, pointer: str, words: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        plan_stream(spec(**fields), world_size, 2, 1)
    assert caught.value.pointer == pointer
    assert words in caught.value.detail


def test_a_permuted_order_of_uneven_shards_has_a_stated_bound() -> None:
    big = spec(
        splitter="hf_datasets",
        num_shards=MAX_COUNTED_SHARDS + 8,
        num_samples=(MAX_COUNTED_SHARDS + 8) * 3 + 1,
    )
    with pytest.raises(InvalidValue, match="100000 shards") as caught:
        plan_stream(big, 8, 4, 1, epoch=1)
    assert caught.value.pointer == "/dataset/num_shards"
    # epoch 0 without shuffle keeps hf_datasets' order, and equal shards need no order at all
    assert plan_stream(big, 8, 4, 1, epoch=0).optimizer_steps_per_epoch > 0
    even = replace(big, num_samples=big.num_shards * 3, shuffle=True)
    assert plan_stream(even, 8, 4, 1, epoch=3).dropped_samples == 0


@pytest.mark.parametrize(
    ("splitter", "shards", "samples", "world_size", "workers", "least"),
    [
        ("webdataset", 3, 30, 4, 2, 4),  # split_by_node: ranks past the shards get none
        ("rank_worker", 4, 40, 3, 2, 5),  # reader 2 x 2 + 0 = 4 needs a fifth shard
        ("rank_worker", 8, 40, 4, 3, 10),
        ("hf_datasets", 5, 5, 4, 5, 4),  # the examples branch: 5 one-sample workers reach rank 0 only
    ],
)
def test_a_rank_without_a_sample_is_refused_with_the_least_shard_count(
    splitter: str, shards: int, samples: int, world_size: int, workers: int, least: int
) -> None:
    asked = spec(splitter=splitter, num_shards=shards, num_samples=samples, num_workers=workers)
    with pytest.raises(InfeasiblePlan) as caught:
        plan_stream(asked, world_size, 1, 1)
    assert caught.value.pointer == "/dataset/num_shards"
    assert caught.value.suggestions == {"dataset.num_shards": [least]}
    fixed = replace(asked, num_shards=least, num_samples=least * 3)
    assert min(g.samples for g in plan_stream(fixed, world_size, 1, 1).rank_groups) > 0
    if splitter != "hf_datasets":  # one fewer leaves a rank empty again
        with pytest.raises(InfeasiblePlan):
            plan_stream(replace(fixed, num_shards=least - 1), world_size, 1, 1)


def test_the_least_shard_count_is_the_least_for_every_shape() -> None:
    for splitter in ("webdataset", "rank_worker"):
        for ws in range(1, 7):
            for K in range(5):
                stream = spec(splitter=splitter, num_workers=K, num_samples=200)
                least = least_num_shards(stream, ws)
                plan_stream(replace(stream, num_shards=least), ws, 3, 1)
                if least > 1:
                    with pytest.raises(InfeasiblePlan):
                        plan_stream(replace(stream, num_shards=least - 1), ws, 3, 1)


def test_too_few_samples_for_the_least_shard_count_points_at_the_samples() -> None:
    with pytest.raises(InfeasiblePlan) as caught:
        plan_stream(spec(num_shards=3, num_samples=3), 5, 1, 1)
    assert caught.value.pointer == "/dataset/num_samples"


def test_hf_with_fewer_shards_than_ranks_reads_everything_everywhere() -> None:
    plan = plan_stream(spec(splitter="hf_datasets", num_shards=3, num_samples=30), 4, 2, 1)
    assert plan.branch == "examples"
    assert [(g.start, g.stop, g.samples, g.shards) for g in plan.rank_groups] == [(0, 2, 8, 3), (2, 4, 7, 3)]
    assert plan.samples_read == 4 * 30
    (warning,) = [w for w in plan.warnings if w.code == "examples_branch"]
    assert warning.sources == ("huggingface/datasets#5961",) and "datasets#5961" in warning.message


def test_idle_workers_are_warned_with_their_sources() -> None:
    plan = plan_stream(spec(splitter="hf_datasets", num_shards=4, num_workers=4), 2, 2, 1)
    assert {(g.shards, g.idle_workers, g.worker_shards) for g in plan.rank_groups} == {(2, 2, (1, 1, 0, 0))}
    (idle,) = [w for w in plan.warnings if w.code == "idle_workers"]
    assert idle.sources == ("huggingface/datasets#8669", "huggingface/lerobot#3781")
    wds = plan_stream(spec(num_shards=4, num_workers=4), 2, 2, 1)
    assert "empty_check=False" in next(w.message for w in wds.warnings if w.code == "idle_workers")


def test_unequal_counts_and_an_endless_stream_are_warned() -> None:
    uneven = spec(num_samples=None, shard_samples=(3, 7, 2, 4), end_of_epoch="steps")
    plan = plan_stream(uneven, 2, 2, 1)
    codes = {w.code: w for w in plan.warnings}
    assert codes["unequal_counts"].sources == (
        "huggingface/datasets#6437",
        "huggingface/datasets#6623",
        "Lightning-AI/litData#233",
        "pytorch/torchtitan#1618",
    )
    assert "steps_without_count" in codes
    assert "steps_without_count" not in {
        w.code for w in plan_stream(uneven, 2, 2, 1, train_steps=100).warnings
    }
    assert plan_stream(spec(), 2, 2, 1).warnings == ()


# webdataset, shards (3, 7, 2, 4) over 2 ranks, micro-batch 2: rank 0 reads shards 0 and 2,
# ids [0, 1, 2, 10, 11] in 3 micro-batches; rank 1 shards 1 and 3, ids 3-9 and 12-15, in 6.
POLICY_CASES = [
    # policy, accumulation: micro-batches run, steps, trained, repeated, never trained
    ("drop", 1, 3, 3, 5 + 6, 0, 5),
    ("drop", 4, 3, 0, 0, 0, 16),  # 3 micro-batches make no step of 4: all skipped
    ("pad", 1, 6, 6, 5 + 6 + 11, 6, 0),  # 3 full micro-batches of rank 0's first samples: 0,1,2,10,11,0
    ("cycle", 1, 6, 6, 5 + 5 + 11, 5, 0),  # rank 0's 3 micro-batches again, the short one too
    ("pad", 4, 6, 1, 5 + 2 + 8, 2, 3),  # 4 micro-batches run; rank 1's last two are skipped
    ("steps", 4, 6, 1, 5 + 5 + 11, 5, 0),  # the 2 past the step open the next pass
]


@pytest.mark.parametrize(
    ("policy", "accumulation", "runs", "steps", "trained", "repeated", "never"), POLICY_CASES
)
def test_end_of_epoch_policies_count_as_worked_by_hand(
    policy: str, accumulation: int, runs: int, steps: int, trained: int, repeated: int, never: int
) -> None:
    stream = spec(num_samples=None, shard_samples=(3, 7, 2, 4), end_of_epoch=policy)
    plan = plan_stream(stream, 2, 2, accumulation)
    assert [(g.samples, g.micro_batches) for g in plan.rank_groups] == [(5, 3), (11, 6)]
    assert (plan.micro_batches_per_epoch, plan.optimizer_steps_per_epoch) == (runs, steps)
    assert plan.leftover_micro_batches == runs % accumulation
    assert (plan.samples_trained, plan.duplicated_samples, plan.dropped_samples) == (trained, repeated, never)
    lists = trained_micro_batches(stream, 2, (2, 2), accumulation)
    counted = Counter(i for rank in lists for batch in rank for i in batch)
    assert (sum(counted.values()), 16 - len(counted)) == (trained, never)
    if policy == "pad" and accumulation == 1:
        assert lists[0][3:] == ((0, 1), (2, 10), (11, 0))


def test_micro_batches_come_round_robin_from_the_workers() -> None:
    # rank_worker, one rank, 3 workers reading 2, 9 and 4 samples: torch's delivery order
    stream = spec(
        splitter="rank_worker", num_shards=3, num_samples=None, shard_samples=(2, 9, 4), num_workers=3
    )
    (batches,) = delivered_micro_batches(stream, 1, (2,))
    assert batches == ((0, 1), (2, 3), (11, 12), (4, 5), (13, 14), (6, 7), (8, 9), (10,))
    assert plan_stream(stream, 1, 2, 1).rank_groups[0].micro_batches == 8  # not ceil(15 / 2)


def test_mixed_micro_batches_are_planned_per_rank() -> None:
    groups = (
        ReplicaGroup(0, 2, "a100", 4, 4, 1.0, 1.0, None),
        ReplicaGroup(2, 4, "t4", 1, 1, 1.0, 0.25, None),
    )
    plan = plan_stream(spec(num_shards=8, num_samples=80), 4, groups, 1)
    assert [(g.start, g.stop, g.micro_batch_size, g.micro_batches) for g in plan.rank_groups] == [
        (0, 2, 4, 5),
        (2, 4, 1, 20),
    ]
    assert plan.micro_batches_per_epoch == 5 and plan.dropped_samples == 2 * 15


def test_suggested_shard_counts_give_every_reader_equal_work() -> None:
    asked = spec(splitter="hf_datasets", num_shards=10, num_samples=1200, num_workers=2, shuffle=True)
    plan = plan_stream(asked, 4, 3, 1, epoch=2)
    assert plan.suggested_num_shards == (8, 16, 24)  # multiples of the 8 readers dividing 1200
    for count in plan.suggested_num_shards:
        for epoch in range(3):
            better = plan_stream(replace(asked, num_shards=count), 4, 3, 1, epoch=epoch)
            (group,) = better.rank_groups
            assert len(set(group.worker_samples)) == 1 and group.idle_workers == 0
            assert better.dropped_samples == better.duplicated_samples == 0
            assert better.suggested_num_shards == ()
    assert plan_stream(replace(asked, num_samples=1201), 4, 3, 1).suggested_num_shards == ()
    # uneven shards of the asked count, shared out evenly, would do: it is suggested itself
    uneven = replace(
        asked, splitter="webdataset", shuffle=False, num_samples=None, shard_samples=(100, 140) * 4
    )
    assert 8 in plan_stream(replace(uneven, num_shards=8), 4, 3, 1).suggested_num_shards


def test_the_plan_counts_what_the_listed_ids_train() -> None:
    """The closed form (no sample listed) against the ids, over random streams."""
    rng = random.Random(48)
    for _ in range(400):
        S, ws = rng.randint(1, 24), rng.randint(1, 6)
        stream = StreamSpec(
            S,
            rng.choice(["hf_datasets", "webdataset", "rank_worker"]),
            shard_samples=tuple(rng.randint(1, 9) for _ in range(S)),
            num_workers=rng.randint(0, 4),
            shuffle=rng.random() < 0.5,
            seed=rng.randint(0, 999),
            end_of_epoch=rng.choice(["drop", "pad", "cycle", "steps"]),
        )
        micro, accumulation, epoch = (
            tuple(rng.randint(1, 5) for _ in range(ws)),
            rng.randint(1, 4),
            rng.randint(0, 3),
        )
        try:
            plan = plan_stream(stream, ws, micro, accumulation, epoch)
        except InfeasiblePlan:
            continue
        lists = trained_micro_batches(stream, ws, micro, accumulation, epoch)
        counted = Counter(i for rank in lists for batch in rank for i in batch)
        assert {len(rank) for rank in lists} == {
            plan.optimizer_steps_per_epoch * accumulation
            + (plan.leftover_micro_batches if stream.end_of_epoch == "steps" else 0)
        }
        assert sum(counted.values()) == plan.samples_trained
        assert sum(counted.values()) - len(counted) == plan.duplicated_samples
        assert plan.num_samples - len(counted) == plan.dropped_samples


def test_large_streams_plan_in_milliseconds() -> None:
    for splitter in ("hf_datasets", "webdataset", "rank_worker"):
        stream = spec(
            splitter=splitter, num_shards=1024, num_samples=MAX_SAFE_INTEGER, num_workers=8, shuffle=True
        )
        started = time.perf_counter()
        plan = plan_stream(stream, 64, 16, 8, epoch=7)
        assert time.perf_counter() - started < 0.5  # a few ms unloaded; two shared cores here
        assert plan.num_samples == MAX_SAFE_INTEGER and plan.optimizer_steps_per_epoch > 10**9
    equal = spec(
        splitter="hf_datasets", num_shards=MAX_STREAM_SHARDS, num_samples=MAX_STREAM_SHARDS * 7, shuffle=True
    )
    started = time.perf_counter()
    plan = plan_stream(equal, 1000, 4, 1, epoch=3)  # equal shards: no order computed
    assert time.perf_counter() - started < 2.0 and len(plan.rank_groups) == 1


def test_ids_of_four_ranks_of_two_workers_list_in_milliseconds() -> None:
    stream = spec(splitter="hf_datasets", num_shards=16, num_samples=4096, num_workers=2, shuffle=True)
    started = time.perf_counter()
    lists = delivered_micro_batches(stream, 4, (8, 8, 8, 8), epoch=1)
    assert time.perf_counter() - started < 0.25
    assert sorted(i for rank in lists for batch in rank for i in batch) == list(range(4096))


def test_the_closed_form_counts_as_the_shard_by_shard_sum() -> None:
    """num_samples shared out (counted from two thresholds) against the same shards listed
    one by one in shard_samples (summed shard by shard), over random shapes and orders."""
    rng = random.Random(4848)
    for _ in range(600):
        S, ws = rng.randint(1, 70), rng.randint(1, 20)
        shared = StreamSpec(
            S,
            rng.choice(["hf_datasets", "webdataset", "rank_worker"]),
            num_samples=rng.randint(S, 9 * S),
            num_workers=rng.randint(0, 9),
            shuffle=rng.random() < 0.3,
            seed=rng.randint(0, 99),
        )
        q, m = divmod(shared.num_samples or 0, S)
        listed = replace(shared, num_samples=None, shard_samples=(q + 1,) * m + (q,) * (S - m))
        micro, epoch = rng.randint(1, 7), rng.choice([0, 0, 1, 4])
        try:
            plan = plan_stream(shared, ws, micro, 2, epoch)
        except InfeasiblePlan:
            with pytest.raises(InfeasiblePlan):
                plan_stream(listed, ws, micro, 2, epoch)
            continue
        assert plan.rank_groups == plan_stream(listed, ws, micro, 2, epoch).rank_groups


def test_micro_batches_must_cover_every_rank() -> None:
    for micro in ([2, 2], [ReplicaGroup(0, 2, "a", 2, 2, 1.0, 1.0, None)], 0, [2, 0, 2]):
        with pytest.raises(ValueError, match="each data-parallel rank"):
            plan_stream(spec(), 3, micro, 1)
