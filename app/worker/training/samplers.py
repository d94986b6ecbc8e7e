"""The samplers a check feeds its replicas through.

Even splits use PyTorch's own `DistributedSampler`. Uneven splits use `ProportionalSampler`,
the layout `app.core.split.sampler.proportional_sampler` describes: every replica runs the same
number of micro-steps, and micro-step k's samples are shared out by micro-batch size.
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from functools import lru_cache

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from app.core.split.sampler import proportional_micro_steps


class IndexDataset(Dataset[int]):
    """Sample i is the number i; the model's inputs are computed from it (see synthetic_model.py)."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> int:
        return index


def index_tensor(indices: Sequence[int]) -> torch.Tensor:
    """Sample indices as an int64 tensor: a list through array("q"), a C loop, not
    torch.tensor's conversion element by element (9 x slower on 131,072 indices)."""
    if isinstance(indices, torch.Tensor):
        return indices.to(torch.int64)
    if isinstance(indices, range) and indices.step == 1:
        return torch.arange(indices.start, indices.stop, dtype=torch.int64)
    if not indices:
        return torch.empty(0, dtype=torch.int64)
    # frombuffer holds a reference to the array, which lives as long as the tensor.
    return torch.frombuffer(array.array("q", indices), dtype=torch.int64)


@lru_cache(maxsize=1)
def _permutation(num_samples: int, seed: int) -> torch.Tensor:
    # Cached: the real samplers of a process's replicas and its Shards read one permutation
    # (a randperm of 1.3M samples costs tens of milliseconds). `release` drops it.
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(num_samples, generator=generator)


def release() -> None:
    """Drop the cached permutation: a warm rank holds no dataset-sized memory between checks."""
    _permutation.cache_clear()


class EpochOrder:
    """One epoch's index list as `DistributedSampler.__iter__` builds it, read by position.

    A permutation seeded with `seed + epoch` (or 0..n-1), padded to `total_size` by repeating
    from the start, or truncated to it: position p holds entry p mod n of the permutation.
    Nothing is built for positions no one reads. Unshuffled, the order is arithmetic and
    costs nothing at any n; shuffled, it is `torch.randperm(n)` itself (8 bytes a sample),
    the draw that fixes PyTorch's order and cannot be made smaller.
    """

    def __init__(self, num_samples: int, total_size: int, shuffle: bool, seed: int, epoch: int) -> None:
        if num_samples < 1:
            raise ValueError("num_samples must be at least 1")
        self.num_samples = num_samples
        self.total_size = total_size
        self._permutation = _permutation(num_samples, seed + epoch) if shuffle else None

    def __len__(self) -> int:
        return self.total_size

    def read(self, positions: range) -> list[int]:
        """The indices at `positions`, which must lie in [0, total_size)."""
        if len(positions) == 0:
            return []
        if min(positions[0], positions[-1]) < 0 or max(positions[0], positions[-1]) >= self.total_size:
            raise IndexError(f"positions {positions} outside the epoch's {self.total_size}")
        n = self.num_samples
        wraps = max(positions[0], positions[-1]) >= n
        if self._permutation is None:
            return [p % n for p in positions] if wraps else list(positions)
        at = torch.arange(positions.start, positions.stop, positions.step)
        taken: list[int] = self._permutation[at % n if wraps else at].tolist()
        return taken

    def __getitem__(self, item: slice) -> list[int]:
        return self.read(range(*item.indices(self.total_size)))


def epoch_indices(num_samples: int, total_size: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The whole epoch's index list (for tests and small epochs: it holds every index)."""
    return EpochOrder(num_samples, total_size, shuffle, seed, epoch)[:]


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
        self.offset = sum(micro_batch_sizes[:rank])
        # The planner's own arithmetic: the sampler reads the epoch the plan's numbers describe.
        self.samples_per_micro_step = sum(micro_batch_sizes)
        self.micro_steps = proportional_micro_steps(num_samples, self.samples_per_micro_step, drop_last)
        self.total_size = self.micro_steps * self.samples_per_micro_step

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.micro_steps * self.micro_batch_size

    def __iter__(self) -> Iterator[int]:
        # Lazily, a micro-step at a time: a loader that stops after one optimizer step reads
        # only that step's positions, whatever the dataset's size.
        order = EpochOrder(self.num_samples, self.total_size, self.shuffle, self.seed, self.epoch)
        for step in range(self.micro_steps):
            start = step * self.samples_per_micro_step + self.offset
            yield from order.read(range(start, start + self.micro_batch_size))


def plan_sampler(
    split: str,
    num_samples: int,
    micro_batch_sizes: Sequence[int],
    replica: int,
    *,
    shuffle: bool,
    seed: int,
    drop_last: bool,
) -> DistributedSampler[int] | ProportionalSampler:
    """Replica `replica`'s sampler as a plan's training job builds it: torch's
    DistributedSampler for an even split, ProportionalSampler for a proportional one."""
    if split == "even":
        return DistributedSampler(
            IndexDataset(num_samples),
            num_replicas=len(micro_batch_sizes),
            rank=replica,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
    return ProportionalSampler(
        num_samples, micro_batch_sizes, replica, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
