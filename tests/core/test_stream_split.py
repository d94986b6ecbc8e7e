"""A stream plan against the real libraries: over seeded random streams
(1-64 shards of uneven sizes, 1-16 ranks, 0-8 workers, every splitter and policy), each rank's
and worker's figures in the plan's rank_groups, and the sample ids it lists, equal what the
real `datasets` (its own split_dataset_by_node), WebDataset (its split_by_node and
split_by_worker) and a torch DataLoader deliver (tests/support/stream_oracle.py). Most cases
run the libraries' code worker by worker in this process; a few run real worker processes.
What an end-of-epoch policy makes of the delivered micro-batches is counted here by hand from
the libraries' delivery and held to the plan's totals.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from support.stream_oracle import RankDelivery, Reading, deliver, quiet

from app.core.errors.domain import InfeasiblePlan
from app.core.records.stream import StreamPlan, StreamSpec
from app.core.split.stream.ids import delivered_micro_batches
from app.core.split.stream.plan import plan_stream

pytestmark = pytest.mark.filterwarnings("ignore:.*This DataLoader will create")

SPLITTERS = ("hf_datasets", "webdataset", "rank_worker")
POLICIES = ("drop", "pad", "cycle", "steps")


def random_case(rng: random.Random) -> tuple[StreamSpec, list[int], int, int]:
    """(stream, each rank's micro-batch, accumulation, epoch)."""
    splitter = rng.choice(SPLITTERS)
    S = rng.randint(1, 64)
    ws = rng.randint(1, 16)
    if splitter == "hf_datasets" and rng.random() < 0.5:  # split_dataset_by_node's shards branch
        S = ws * rng.randint(1, 64 // ws)
    if rng.random() < 0.3:  # shared out as to_iterable_dataset does
        sizes = None
        num_samples: int | None = rng.randint(S, S * 6)
    else:
        sizes = tuple(rng.randint(1, 12) for _ in range(S))
        num_samples = None
    micro = [rng.randint(1, 6)] * ws if rng.random() < 0.7 else [rng.randint(1, 6) for _ in range(ws)]
    spec = StreamSpec(
        num_shards=S,
        splitter=splitter,
        shard_samples=sizes,
        num_samples=num_samples,
        num_workers=rng.choice([0, 0, 1, 2, 3, 4, 8, rng.randint(0, 8)]),
        shuffle=rng.random() < 0.5,
        seed=rng.randint(0, 2**31),
        end_of_epoch=rng.choice(POLICIES),
    )
    return spec, micro, rng.randint(1, 4), rng.choice([0, 0, 1, 2, 5])


def shard_list(spec: StreamSpec) -> list[int]:
    if spec.shard_samples is not None:
        return list(spec.shard_samples)
    q, m = divmod(spec.num_samples or 0, spec.num_shards)
    return [q + 1] * m + [q] * (spec.num_shards - m)


def policy_totals(
    got: list[RankDelivery], micro: list[int], policy: str, accumulation: int
) -> tuple[int, int, int, int]:
    """(samples trained, repeats, samples never trained, optimizer steps) of one epoch, counted
    from the libraries' delivered micro-batches as each policy is stated in the issue."""
    counts = [len(r.micro_batches) for r in got]
    runs = min(counts) if policy == "drop" else max(counts)
    steps, leftover = divmod(runs, accumulation)
    if policy != "steps":
        runs -= leftover
    trained: Counter[int] = Counter()
    for r, rank in enumerate(got):
        own = rank.micro_batches
        sequence = list(own)
        if policy == "pad":
            flat = [i for batch in own for i in batch]
            while len(sequence) < runs:
                j = len(sequence) - len(own)
                sequence.append([flat[(j * micro[r] + i) % len(flat)] for i in range(micro[r])])
        else:
            while len(sequence) < runs:
                sequence += own
        trained.update(i for batch in sequence[:runs] for i in batch)
    N = sum(len(ids) for rank in got for ids in rank.worker_samples)
    return sum(trained.values()), sum(v - 1 for v in trained.values()), N - len(trained), steps


def assert_plan_is_delivered(plan: StreamPlan, spec: StreamSpec, got: list[RankDelivery], micro: list[int]):
    for group in plan.rank_groups:
        for r in range(group.start, group.stop):
            rank = got[r]
            assert group.worker_samples == tuple(len(s) for s in rank.worker_samples), r
            assert group.samples == sum(group.worker_samples)
            assert group.micro_batches == len(rank.micro_batches), r
            assert group.micro_batch_size == micro[r]
            if plan.branch != "examples":  # there a worker reads shards it keeps nothing of
                assert group.worker_shards == tuple(len(s) for s in rank.worker_shards), r
                assert group.idle_workers == sum(1 for s in rank.worker_samples if not s)
    ids = sorted(i for rank in got for batch in rank.micro_batches for i in batch)
    assert ids == list(range(plan.num_samples))  # every sample delivered once, to one rank


def check_case(
    spec: StreamSpec, micro: list[int], accumulation: int, epoch: int, monkeypatch, cache: Path, mode: str
) -> str:
    ws = len(micro)
    reading = Reading(
        shard_list(spec), ws, spec.num_workers, spec.splitter or "", micro, spec.shuffle, spec.seed, epoch
    )
    got = deliver(reading, monkeypatch, cache, mode)
    try:
        plan = plan_stream(spec, ws, micro, accumulation, epoch)
    except InfeasiblePlan:
        # refused exactly where the libraries leave a rank without a sample
        assert any(not r.micro_batches for r in got)
        return "refused"
    assert_plan_is_delivered(plan, spec, got, micro)
    listed = delivered_micro_batches(spec, ws, tuple(micro), epoch)
    assert [[list(b) for b in rank] for rank in listed] == [r.micro_batches for r in got]
    trained, repeats, never, steps = policy_totals(got, micro, spec.end_of_epoch, accumulation)
    assert (plan.samples_trained, plan.duplicated_samples, plan.dropped_samples) == (trained, repeats, never)
    assert plan.optimizer_steps_per_epoch == steps
    return plan.branch or spec.splitter or ""


CHUNKS, PER_CHUNK = 6, 20


def draws(chunk: int) -> list[tuple[StreamSpec, list[int], int, int]]:
    rng = random.Random(4800 + chunk)
    return [random_case(rng) for _ in range(PER_CHUNK)]


def test_the_draws_cover_every_branch_splitter_policy_and_refusal() -> None:
    seen: Counter[str] = Counter()
    for chunk in range(CHUNKS):
        for spec, micro, accumulation, epoch in draws(chunk):
            seen[spec.end_of_epoch] += 1
            seen["mixed micro-batches"] += len(set(micro)) > 1
            try:
                plan = plan_stream(spec, len(micro), micro, accumulation, epoch)
            except InfeasiblePlan:
                seen["refused"] += 1
                continue
            seen[plan.branch or spec.splitter or ""] += 1
    wanted = {"shards", "examples", "webdataset", "rank_worker", "refused", "mixed micro-batches", *POLICIES}
    assert all(seen[key] >= 3 for key in wanted), seen


@pytest.mark.slow  # 120 streams through the libraries: ~25 s of CPU in all, in chunks for -n
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_plans_equal_what_the_libraries_deliver(
    chunk: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    quiet()
    for spec, micro, accumulation, epoch in draws(chunk):
        check_case(spec, micro, accumulation, epoch, monkeypatch, tmp_path, "sim")


REAL_CASES = [
    (StreamSpec(6, "hf_datasets", shard_samples=(3, 5, 2, 4, 1, 6), num_workers=2), [2, 2, 2]),
    (
        StreamSpec(5, "hf_datasets", shard_samples=(3, 5, 2, 4, 7), num_workers=2, shuffle=True, seed=9),
        [2, 3],
    ),
    (StreamSpec(7, "webdataset", shard_samples=(3, 5, 2, 4, 1, 6, 2), num_workers=3, shuffle=True), [2, 2]),
    (StreamSpec(9, "rank_worker", num_samples=40, num_workers=2, end_of_epoch="cycle"), [3, 3, 4]),
]


@pytest.mark.parametrize(("spec", "micro"), REAL_CASES)
def test_real_worker_processes_deliver_as_planned(
    spec: StreamSpec, micro: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    quiet()
    assert check_case(spec, micro, 2, 1, monkeypatch, tmp_path, "real") != "refused"


def test_a_shuffle_buffer_changes_the_order_not_the_counts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """datasets' default buffer (1000) and 10 input shards reorder within a worker and, in the
    examples branch, change which samples a rank keeps; the plan's counts still hold."""
    quiet()
    for shards, ws in (((3, 5, 2, 4, 1, 6), 3), ((3, 5, 2, 4, 7), 2)):
        spec = StreamSpec(
            len(shards), "hf_datasets", shard_samples=shards, num_workers=2, shuffle=True, seed=4
        )
        reading = Reading(list(shards), ws, 2, "hf_datasets", [2] * ws, True, 4, 3, 1000, 10)
        got = deliver(reading, monkeypatch, tmp_path)
        plan = plan_stream(spec, ws, 2, 1, epoch=3)
        for group in plan.rank_groups:
            for r in range(group.start, group.stop):
                assert group.worker_samples == tuple(len(s) for s in got[r].worker_samples)
                assert group.micro_batches == len(got[r].micro_batches)
