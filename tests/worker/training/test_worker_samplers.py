"""The samplers a check feeds replicas through, against PyTorch and the core's arithmetic."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DistributedSampler  # noqa: E402

from app.core.records.plan_request import DatasetSpec  # noqa: E402
from app.core.split.sampler import proportional_sampler  # noqa: E402
from app.worker.training.samplers import EpochOrder, IndexDataset, ProportionalSampler, epoch_indices  # noqa: E402


@pytest.mark.parametrize("n, replicas", [(10, 3), (10, 4), (7, 7), (5, 8), (1, 3), (100, 16)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_epoch_layout_is_distributed_samplers(n: int, replicas: int, shuffle: bool, drop_last: bool) -> None:
    # drop_last with fewer samples than replicas: DistributedSampler yields nothing, and the
    # layout must be empty too (a case, not a skip).
    samplers = [
        DistributedSampler(
            IndexDataset(n), num_replicas=replicas, rank=r, shuffle=shuffle, seed=3, drop_last=drop_last
        )
        for r in range(replicas)
    ]
    for s in samplers:
        s.set_epoch(2)
    total = samplers[0].total_size
    epoch = epoch_indices(n, total, shuffle, 3, 2)
    for r, s in enumerate(samplers):
        assert list(s) == list(epoch[r:total:replicas])
    if drop_last and n < replicas:
        assert total == 0 and not any(list(s) for s in samplers)


@pytest.mark.parametrize("n", [1, 5, 29, 30, 31, 1000])
@pytest.mark.parametrize("drop_last", [True, False])
def test_proportional_lengths_agree_with_the_core(n: int, drop_last: bool) -> None:
    micro = [5, 9, 8, 10]
    plan = proportional_sampler(DatasetSpec(num_samples=n, drop_last=drop_last), 4, sum(micro), 1)
    samplers = [ProportionalSampler(n, micro, r, seed=1, drop_last=drop_last) for r in range(4)]
    for r, s in enumerate(samplers):
        assert s.total_size == plan.total_size
        assert s.micro_steps == plan.micro_steps_per_epoch
        assert len(s) == len(list(s)) == plan.micro_steps_per_epoch * micro[r]


def test_proportional_micro_steps_tile_the_epoch() -> None:
    micro, n = [3, 1, 2], 20
    samplers = [ProportionalSampler(n, micro, r, shuffle=True, seed=4) for r in range(3)]
    for s in samplers:
        s.set_epoch(1)
    streams = [list(s) for s in samplers]
    epoch = epoch_indices(n, samplers[0].total_size, True, 4, 1)
    rebuilt = []
    for step in range(samplers[0].micro_steps):
        for r, m in enumerate(micro):
            rebuilt += streams[r][step * m : (step + 1) * m]
    assert rebuilt == list(epoch)
    assert sorted(set(epoch)) == list(range(n))  # padding repeats, never invents
    other = ProportionalSampler(n, micro, 0, shuffle=True, seed=4)
    other.set_epoch(2)
    assert list(other) != streams[0]  # set_epoch reshuffles


def test_proportional_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ProportionalSampler(10, [2, 2], 2)
    with pytest.raises(ValueError):
        ProportionalSampler(10, [2, 0], 0)


@pytest.mark.parametrize("n", [1, 7, 29, 30, 31, 97, 1000])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_proportional_epoch_sees_every_sample_once_but_as_the_plan_pads_or_drops(
    n: int, drop_last: bool, shuffle: bool
) -> None:
    from collections import Counter

    micro = [5, 9, 8, 10]
    plan = proportional_sampler(DatasetSpec(num_samples=n, drop_last=drop_last), 4, sum(micro), 1)
    seen: Counter[int] = Counter()
    for r in range(len(micro)):
        sampler = ProportionalSampler(n, micro, r, shuffle=shuffle, seed=7, drop_last=drop_last)
        sampler.set_epoch(3)
        seen.update(sampler)
    assert set(seen) <= set(range(n))
    assert sum(seen.values()) == plan.total_size
    repeats = sum(count - 1 for count in seen.values())
    never = n - len(seen)
    assert repeats == plan.padded_samples  # padding repeats indices, nothing else does
    assert never == plan.dropped_samples  # drop_last leaves exactly these out


@pytest.mark.parametrize(
    "n, replicas, drop_last", [(10, 4, False), (5, 8, False), (1, 3, False), (11, 4, True)]
)
@pytest.mark.parametrize("shuffle", [True, False])
def test_reading_by_position_is_the_epoch_list(n: int, replicas: int, drop_last: bool, shuffle: bool) -> None:
    sampler = DistributedSampler(
        IndexDataset(n), num_replicas=replicas, rank=0, shuffle=shuffle, seed=5, drop_last=drop_last
    )
    whole = epoch_indices(n, sampler.total_size, shuffle, 5, 1)
    order = EpochOrder(n, sampler.total_size, shuffle, 5, 1)
    for start in range(sampler.total_size):
        for stop in range(start, sampler.total_size + 1):
            assert order.read(range(start, stop)) == whole[start:stop]
    with pytest.raises(IndexError):
        order.read(range(sampler.total_size, sampler.total_size + 1))


def test_an_unshuffled_epoch_of_any_size_is_read_without_building_it() -> None:
    n = 10**12  # a list of it would not fit in any memory
    order = EpochOrder(n, n + 2, False, 0, 0)  # padded by 2, as for 4 replicas
    assert order.read(range(0, 8, 4)) == [0, 4]
    assert order.read(range(n - 2, n + 2)) == [n - 2, n - 1, 0, 1]
    sampler = ProportionalSampler(n, [3, 5], 1, shuffle=False)
    first = list(itertools.islice(iter(sampler), 10))
    assert first == [3, 4, 5, 6, 7, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_check_derives_distributed_samplers_batches_beyond_the_size_it_reads_them(shuffle: bool) -> None:
    """Above REAL_SAMPLER_MAX_SAMPLES a check derives each replica's batches instead of running
    DistributedSampler: the derivation is DistributedSampler's first step there too."""
    from app.contract.request import build_spec, check_request
    from app.worker.checks.shards import REAL_SAMPLER_MAX_SAMPLES, Shards

    n = REAL_SAMPLER_MAX_SAMPLES + 3
    plan = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 64, "micro_batch_size": 8}
    dataset = {"num_samples": n, "shuffle": shuffle, "seed": 9}
    spec = build_spec(check_request({"plan": {**plan, "dataset": dataset}}))
    shards = Shards(spec)
    assert not shards.sampler_checked and spec.gradient_accumulation_steps == 2
    for replica in range(4):
        sampler = DistributedSampler(IndexDataset(n), num_replicas=4, rank=replica, shuffle=shuffle, seed=9)
        first_step = list(itertools.islice(iter(sampler), 16))
        assert shards.derived(replica) == [first_step[:8], first_step[8:]]
