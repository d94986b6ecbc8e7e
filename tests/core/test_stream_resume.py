"""A rank_worker stream's resume on another world size, against torch's own DataLoader with
worker processes.

The uninterrupted run: W ranks, each a DataLoader of K workers over an IterableDataset whose
worker w of rank r is reader g = r x K + w and reads the shards g, g + R, ... (R = W x K), a
shard's samples the ids of its rows. Global batch t is every rank's micro-batches of step t.
The resumed run is built from the answer alone: resume.data_parallel_size ranks of
resume.stream.num_workers workers, reader g starting in its shard_in_reader-th shard at
`offset`, batching with the answer's micro-batch and accumulation. Where the answer says
same_global_batches, every later global batch equals the uninterrupted run's as a set; where
it says not, one differs. The consumed samples are the first global batches'.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import pytest
import torch
import torch.utils.data as tud

from app.core.planner import plan
from app.core.records.plan import Plan
from app.schemas.plan_requests import PlanRequestIn

# Uneven shards: short last micro-batches; in the second, readers 1 and 5 run dry first, so a
# rank of two workers delivers its other reader's micro-batches twice a round.
EVEN_ENDS = (13, 9, 12, 10, 11, 9, 12, 10)
ONE_RUNS_DRY = (13, 3, 12, 10, 11, 2, 12, 10)


class _Readers(tud.IterableDataset[int]):
    """One rank's share of a rank_worker stream: its worker w reads as reader rank x K + w."""

    def __init__(
        self,
        sizes: tuple[int, ...],
        rank: int,
        workers: int,
        readers: int,
        starts: dict[int, tuple[int, int]],
    ) -> None:
        self.sizes, self.rank, self.workers, self.readers, self.starts = sizes, rank, workers, readers, starts

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        g = self.rank * self.workers + (info.id if info is not None else 0)
        first, offset = self.starts.get(g, (0, 0))
        bounds = [0, *accumulate(self.sizes)]
        for k, shard in enumerate(range(g, len(self.sizes), self.readers)):
            if k >= first:
                yield from range(bounds[shard] + (offset if k == first else 0), bounds[shard + 1])


def _global_batches(
    sizes: tuple[int, ...],
    ranks: int,
    workers: int,
    micro: int,
    accumulation: int,
    starts: dict[int, tuple[int, int]],
) -> list[set[int]]:
    readers = ranks * workers
    runs = []
    for r in range(ranks):
        dataset = _Readers(sizes, r, workers, readers, starts)
        runs.append([b.tolist() for b in tud.DataLoader(dataset, batch_size=micro, num_workers=workers)])
    steps = min(len(x) for x in runs) // accumulation  # end_of_epoch "drop"
    return [
        {i for x in runs for batch in x[t * accumulation : (t + 1) * accumulation] for i in batch}
        for t in range(steps)
    ]


def _planned(sizes: tuple[int, ...], ranks: int, workers: int, resume: dict[str, int]) -> Plan:
    body: dict[str, Any] = {
        "topology": {"num_nodes": 1, "gpus_per_node": ranks},
        "global_batch_size": 16,
        "micro_batch_size": 4,
        "dataset": {
            "kind": "stream",
            "shard_samples": list(sizes),
            "num_shards": len(sizes),
            "splitter": "rank_worker",
            "num_workers": workers,
        },
        "resume": resume,
    }
    return plan(PlanRequestIn.model_validate(body).to_core())


@pytest.mark.parametrize(
    ("sizes", "at", "data_parallel_size", "same"), [(EVEN_ENDS, 2, 4, True), (ONE_RUNS_DRY, 1, 1, False)]
)
def test_the_resumed_readers_deliver_the_later_global_batches_as_the_answer_says(
    sizes: tuple[int, ...], at: int, data_parallel_size: int, same: bool
) -> None:
    torch.manual_seed(0)
    before = _global_batches(sizes, 2, 2, 4, 2, {})
    consumed = sum(len(b) for b in before[:at])
    answer = _planned(sizes, 2, 2, {"consumed_samples": consumed, "data_parallel_size": data_parallel_size})
    resume = answer.resume
    assert resume is not None and resume.stream is not None
    assert resume.optimizer_step == at
    assert resume.optimizer_steps_per_epoch_before == len(before)
    starts = {
        g: (group.shard_in_reader, group.offset)
        for group in resume.stream.reader_groups
        for g in range(group.start, group.stop)
    }
    after = _global_batches(
        sizes,
        data_parallel_size,
        resume.stream.num_workers,
        resume.micro_batch_size or 0,
        resume.gradient_accumulation_steps,
        starts,
    )
    assert resume.same_global_batches is same
    assert same or resume.suggestions == {"resume.data_parallel_size": [2]}  # the plan's own size is exact
    assert (after == before[at:]) is same, resume.why
    taken = {i for b in before[:at] for i in b}
    assert not taken & {i for b in after for i in b}  # no reader trains a consumed sample again
