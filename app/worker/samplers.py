"""The samplers a check feeds its replicas through.

Even splits use PyTorch's own `DistributedSampler`. Uneven splits use `ProportionalSampler`,
the layout `app.core.sampler.proportional_sampler` describes: every replica runs the same
number of micro-steps, and micro-step k's samples are shared out by micro-batch size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import lru_cache

import torch
from torch.utils.data import Dataset, Sampler


class IndexDataset(Dataset[int]):
    """Sample i is the number i; the model's inputs are computed from it (see model.py)."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> int:
        return index


@lru_cache(maxsize=2)
def epoch_indices(num_samples: int, total_size: int, shuffle: bool, seed: int, epoch: int) -> tuple[int, ...]:
    """One epoch's index list, built as `DistributedSampler.__iter__` builds it.

    A permutation seeded with `seed + epoch` (or 0..n-1), padded to `total_size` by repeating
    from the start, or truncated to it. Cached: emulated replicas of one process share it,
    and a 1.3M-sample permutation costs tens of milliseconds per build.
    """
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        indices: list[int] = torch.randperm(num_samples, generator=generator).tolist()
    else:
        indices = list(range(num_samples))
    padding = total_size - len(indices)
    if padding > 0:
        if padding <= len(indices):
            indices += indices[:padding]
        else:
            indices += (indices * math.ceil(padding / len(indices)))[:padding]
    else:
        indices = indices[:total_size]
    return tuple(indices)


class ProportionalSampler(Sampler[int]):
    """Replica `rank`'s indices when replicas take micro-batches of different sizes.

    Micro-step k covers positions [k·S, (k+1)·S) of the epoch index list, S being the sum of
    all micro-batch sizes; replica r reads the contiguous slice of length `micro[r]` that
    starts after the slices of the lower ranks. The epoch list is shuffled with
    `seed + epoch`, padded by repeating from the start (or truncated with `drop_last`) to a
    whole number of micro-steps. Use it with `DataLoader(batch_size=micro[rank])` and call
    `set_epoch` every epoch, as with `DistributedSampler`.
    """

    def __init__(
        self,
        num_samples: int,
        micro_batch_sizes: Sequence[int],
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if not 0 <= rank < len(micro_batch_sizes):
            raise ValueError(f"rank {rank} is outside [0, {len(micro_batch_sizes)})")
        if num_samples < 1 or min(micro_batch_sizes) < 1:
            raise ValueError("num_samples and every micro-batch size must be at least 1")
        self.num_samples = num_samples
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.micro_batch_size = micro_batch_sizes[rank]
        self.samples_per_micro_step = sum(micro_batch_sizes)
        self.offset = sum(micro_batch_sizes[:rank])
        per_step = self.samples_per_micro_step
        self.micro_steps = num_samples // per_step if drop_last else -(-num_samples // per_step)
        self.total_size = self.micro_steps * per_step

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.micro_steps * self.micro_batch_size

    def __iter__(self) -> Iterator[int]:
        indices = epoch_indices(self.num_samples, self.total_size, self.shuffle, self.seed, self.epoch)
        for step in range(self.micro_steps):
            start = step * self.samples_per_micro_step + self.offset
            yield from indices[start : start + self.micro_batch_size]
