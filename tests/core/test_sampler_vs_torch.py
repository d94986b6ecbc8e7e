"""The plan's sampler numbers against PyTorch's own DistributedSampler and DataLoader."""

from __future__ import annotations

import random

import pytest
import torch.utils.data as tud
from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import examples, homogeneous

from app.core.planner import plan
from app.core.records.plan import SamplerPlan
from app.core.records.plan_request import MAX_SAFE_INTEGER, DatasetSpec


class SizedDataset(tud.Dataset[int]):
    """A map-style dataset that is only a length: nothing is materialised."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


def torch_numbers(
    num_samples: int, replicas: int, micro: int, shuffle: bool, drop_last: bool
) -> dict[str, int]:
    dataset = SizedDataset(num_samples)
    sampler = tud.DistributedSampler(
        dataset, num_replicas=replicas, rank=0, shuffle=shuffle, drop_last=drop_last
    )
    loader = tud.DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=False)
    return {"per_replica": len(sampler), "total_size": sampler.total_size, "micro_steps": len(loader)}


def planned_sampler(
    num_samples: int,
    replicas: int,
    micro: int,
    accumulation: int,
    shuffle: bool,
    drop_last: bool,
    seed: int = 0,
) -> SamplerPlan:
    dataset = DatasetSpec(num_samples=num_samples, shuffle=shuffle, seed=seed, drop_last=drop_last)
    result = plan(
        homogeneous(
            replicas, micro_batch_size=micro, gradient_accumulation_steps=accumulation, dataset=dataset
        )
    )
    assert result.data_parallel_size == replicas
    assert result.split == "even"
    assert result.sampler is not None
    return result.sampler


def assert_matches_torch(
    num_samples: int, replicas: int, micro: int, accumulation: int, shuffle: bool, drop_last: bool
) -> None:
    expected = torch_numbers(num_samples, replicas, micro, shuffle, drop_last)
    sampler = planned_sampler(num_samples, replicas, micro, accumulation, shuffle, drop_last)
    case = (num_samples, replicas, micro, accumulation, shuffle, drop_last)
    assert sampler.kind == "DistributedSampler", case
    assert sampler.num_replicas == replicas, case
    assert sampler.num_samples_per_replica == expected["per_replica"], case
    assert sampler.total_size == expected["total_size"], case
    assert sampler.micro_steps_per_epoch == expected["micro_steps"], case
    assert sampler.optimizer_steps_per_epoch == expected["micro_steps"] // accumulation, case
    assert sampler.shuffle is shuffle and sampler.drop_last is drop_last, case
    if drop_last:
        assert sampler.padded_samples == 0, case
        assert sampler.dropped_samples == num_samples - expected["total_size"], case
    else:
        assert sampler.dropped_samples == 0, case
        assert sampler.padded_samples == expected["total_size"] - num_samples, case


dataset_sizes = st.one_of(
    st.integers(1, 10**7),
    st.integers(1, 100),
    st.integers(MAX_SAFE_INTEGER - 10**6, MAX_SAFE_INTEGER),
    st.integers(2**52 - 1000, 2**52 + 1000),
)


@examples(150)
@given(
    num_samples=dataset_sizes,
    replicas=st.integers(1, 4096),
    micro=st.integers(1, 512),
    accumulation=st.integers(1, 16),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_sampler_lengths_match_torch(
    num_samples: int, replicas: int, micro: int, accumulation: int, shuffle: bool, drop_last: bool
) -> None:
    assert_matches_torch(num_samples, replicas, micro, accumulation, shuffle, drop_last)


def test_sampler_lengths_match_torch_seeded_sweep() -> None:
    rng = random.Random(20240531)
    for _ in range(300):
        num_samples = rng.choice(
            [rng.randint(1, 10**7), rng.randint(1, 50), MAX_SAFE_INTEGER - rng.randint(0, 10**4)]
        )
        replicas = rng.choice([rng.randint(1, 4096), rng.randint(1, 16)])
        assert_matches_torch(
            num_samples,
            replicas,
            rng.randint(1, 512),
            rng.randint(1, 16),
            rng.random() < 0.5,
            rng.random() < 0.5,
        )


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_samples", [MAX_SAFE_INTEGER, MAX_SAFE_INTEGER - 1, 2**53 - 3, 2**52 + 1])
@pytest.mark.parametrize("replicas", [1, 3, 7, 1000, 4095, 4096])
def test_sampler_lengths_match_torch_at_the_integer_limit(
    num_samples: int, replicas: int, drop_last: bool
) -> None:
    assert_matches_torch(num_samples, replicas, 512, 16, True, drop_last)


def epoch_indices(
    num_samples: int, replicas: int, shuffle: bool, drop_last: bool, seed: int
) -> list[list[int]]:
    dataset = SizedDataset(num_samples)
    ranks = []
    for rank in range(replicas):
        sampler = tud.DistributedSampler(
            dataset, num_replicas=replicas, rank=rank, shuffle=shuffle, drop_last=drop_last, seed=seed
        )
        sampler.set_epoch(3)
        ranks.append(list(sampler))
    return ranks


@examples(60)
@given(
    num_samples=st.integers(1, 200),
    replicas=st.integers(1, 24),
    micro=st.integers(1, 9),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_padded_and_dropped_counts_match_the_indices_torch_hands_out(
    num_samples: int, replicas: int, micro: int, shuffle: bool, drop_last: bool, seed: int
) -> None:
    sampler = planned_sampler(num_samples, replicas, micro, 1, shuffle, drop_last, seed)
    ranks = epoch_indices(num_samples, replicas, shuffle, drop_last, seed)
    handed_out = [i for rank in ranks for i in rank]
    distinct = set(handed_out)

    assert all(len(rank) == sampler.num_samples_per_replica for rank in ranks)
    assert len(handed_out) == sampler.total_size
    # Every index handed out more than once is padding; every index never handed out is dropped.
    assert len(handed_out) - len(distinct) == sampler.padded_samples
    assert num_samples - len(distinct) == sampler.dropped_samples
    assert distinct <= set(range(num_samples))
    assert sampler.seed == seed
    # The DataLoader over one rank's shard runs micro_steps_per_epoch batches.
    loader = tud.DataLoader(SizedDataset(num_samples), batch_size=micro, sampler=ranks[0], drop_last=False)
    assert sum(1 for _ in loader) == sampler.micro_steps_per_epoch


def test_imagenet_on_sixteen_replicas_pads_one_sample() -> None:
    expected = torch_numbers(1281167, 16, 32, True, False)
    sampler = planned_sampler(1281167, 16, 32, 1, True, False)
    assert (sampler.num_samples_per_replica, sampler.total_size, sampler.micro_steps_per_epoch) == (
        expected["per_replica"],
        expected["total_size"],
        expected["micro_steps"],
    )
    assert sampler.padded_samples == expected["total_size"] - 1281167 == 1
