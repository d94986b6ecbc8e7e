"""Which samples each replica reads in a check's first optimizer step: through the plan's
real sampler, derived from the epoch's index list, and under each control.

Everything a first step reads lies in the epoch's first G positions (G the global batch):
replica r's shard starts at position r, micro-step k of a proportional split at k·S, and the
controls read the leading samples. So a check holds those G indices, never the epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch
from torch.utils.data import DataLoader

from app.contract.spec import CheckSpec
from app.worker.checks.controls import SAMPLER, SampleControl, WeightedBatch, control_positions
from app.worker.training import samplers
from app.worker.training.samplers import EpochOrder, IndexDataset, index_tensor, plan_sampler

# DistributedSampler builds the whole epoch as a Python list (about 40 bytes a sample) on every
# call (10 MiB at this size): up to it a check reads its first replica through it; beyond, through the same
# layout derived from the same torch.randperm (which tests hold against DistributedSampler).
REAL_SAMPLER_MAX_SAMPLES = 1 << 18


# Up to this many replicas on a process, each reads through its real sampler (a proportional
# split) as before; beyond, the first and last replica of each replica group on the process do,
# and the rest are computed by the same arithmetic, vectorised (ProportionalSampler's offset is
# a sum over the lower replicas: 50,000 samplers on a process would cost minutes).
REAL_SAMPLER_MAX_LOCAL_REPLICAS = 64


@dataclass(frozen=True, slots=True)
class Pool:
    """The replicas [start, stop) of one replica group (one micro-batch size and loss scale)
    that a process runs, and every sample their first optimizer step reads, replica by
    replica and micro-step by micro-step: one tensor of (stop - start) x g x micro indices."""

    start: int
    stop: int
    micro: int
    scale: float
    indices: torch.Tensor


def _chunks(indices: Sequence[int], size: int, count: int) -> list[list[int]]:
    return [list(indices[k * size : (k + 1) * size]) for k in range(count)]


class Shards:
    """The first optimizer step's micro-batches of every replica, by the plan's sampler."""

    def __init__(self, spec: CheckSpec) -> None:
        self.spec = spec
        self.sizes = spec.micro_batch_sizes()
        self.scales = spec.loss_scales()
        self.offsets = [0, *accumulate(self.sizes)]
        order = EpochOrder(spec.num_samples, spec.total_size, spec.shuffle, spec.data_seed, 0)
        self.epoch = order[: spec.global_batch_size]  # all the first step reads (see above)
        self._reads: dict[tuple[int, int], list[int]] = {}
        self._derived: dict[int, list[list[int]]] = {}
        self._pools: dict[tuple[int, int], list[Pool]] = {}
        self._epoch: torch.Tensor | None = None

    def derived(self, replica: int) -> list[list[int]]:
        """The sampler's output computed from the epoch list, for emulated replicas and for
        deciding which controls apply; `through_sampler` checks it against the real one."""
        if replica not in self._derived:
            spec, g, micro = self.spec, self.spec.gradient_accumulation_steps, self.sizes[replica]
            if spec.split == "even":
                shard = self.epoch[replica : g * micro * spec.data_parallel_size : spec.data_parallel_size]
                self._derived[replica] = _chunks(shard, micro, g)
            else:
                per_step, start = self.offsets[-1], self.offsets[replica]
                self._derived[replica] = [
                    list(self.epoch[k * per_step + start : k * per_step + start + micro]) for k in range(g)
                ]
        return self._derived[replica]

    @property
    def sampler_checked(self) -> bool:
        """Whether the check reads a replica through the plan's real sampler (see above)."""
        return self.spec.split == "proportional" or self.spec.num_samples <= REAL_SAMPLER_MAX_SAMPLES

    def through_sampler(self, replica: int) -> list[list[int]]:
        """What a DataLoader over the plan's sampler yields for the first optimizer step."""
        spec = self.spec
        sampler = plan_sampler(
            spec.split,
            spec.num_samples,
            self.sizes,
            replica,
            shuffle=spec.shuffle,
            seed=spec.data_seed,
            drop_last=spec.drop_last,
        )
        sampler.set_epoch(0)
        loader = DataLoader(IndexDataset(spec.num_samples), batch_size=self.sizes[replica], sampler=sampler)
        batches: list[list[int]] = []
        for batch in loader:
            batches.append(batch.tolist())
            if len(batches) == spec.gradient_accumulation_steps:
                break
        if batches != self.derived(replica):
            raise RuntimeError(f"replica {replica}: the sampler's batches differ from the epoch layout")
        return batches

    def local(self, replicas: range) -> dict[int, list[list[int]]]:
        """Real samplers for every replica of a proportional split; for an even split the
        first local replica goes through DistributedSampler itself, and the rest (emulated)
        use its layout, since each DistributedSampler rebuilds the whole epoch."""
        out = {}
        for replica in replicas:
            real = self.spec.split == "proportional" or replica == replicas.start
            out[replica] = (
                self.through_sampler(replica) if real and self.sampler_checked else self.derived(replica)
            )
        samplers.release()
        return out

    def pools(self, replicas: range, prove: bool = True) -> list[Pool]:
        """`replicas`' first-step samples, one Pool per replica group, the index arithmetic
        of the plan's sampler in tensors (`derived`'s, for all of them at once). Up to
        REAL_SAMPLER_MAX_LOCAL_REPLICAS every replica, beyond it the first and last of each
        group, is read through its real sampler too and must give its rows exactly."""
        if (replicas.start, replicas.stop) in self._pools:
            return self._pools[(replicas.start, replicas.stop)]
        spec, g, dp = self.spec, self.spec.gradient_accumulation_steps, self.spec.data_parallel_size
        epoch = self._epoch_tensor()
        out: list[Pool] = []
        for part in spec.slices:
            a, b, m = max(part.start, replicas.start), min(part.stop, replicas.stop), part.micro_batch_size
            if a >= b:
                continue
            steps, within = torch.arange(g).view(1, g, 1), torch.arange(m).view(1, 1, m)
            if spec.split == "even":  # DistributedSampler: replica r reads every dp-th position from r
                first = torch.arange(a, b).view(-1, 1, 1)
                positions = first + (steps * m + within) * dp
            else:  # ProportionalSampler: micro-step k's slice of S positions, shared out in order
                first = (self.offsets[a] + torch.arange(b - a) * m).view(-1, 1, 1)
                positions = first + steps * self.offsets[-1] + within
            out.append(Pool(a, b, m, self.scales[a], epoch[positions.reshape(-1)]))
        if prove:
            self._prove(replicas, out)
        self._pools[(replicas.start, replicas.stop)] = out
        return out

    def _prove(self, replicas: range, pools: list[Pool]) -> None:
        """The real sampler's batches against the pooled rows, for the replicas it reads."""
        if not self.sampler_checked:
            return
        g, every = self.spec.gradient_accumulation_steps, len(replicas) <= REAL_SAMPLER_MAX_LOCAL_REPLICAS
        for pool in pools:
            rows = pool.indices.view(pool.stop - pool.start, g, pool.micro)
            if self.spec.split == "even":  # as `local`: each DistributedSampler builds the epoch
                read: Sequence[int] = [replicas.start] if pool.start == replicas.start else []
            else:
                read = range(pool.start, pool.stop) if every else sorted({pool.start, pool.stop - 1})
            for r in read:
                if self.through_sampler(r) != rows[r - pool.start].tolist():
                    raise RuntimeError(f"replica {r}: the sampler's batches differ from the pooled rows")
        samplers.release()

    def _epoch_tensor(self) -> torch.Tensor:
        if self._epoch is None:
            self._epoch = index_tensor(self.epoch)
        return self._epoch

    def control_batches(
        self, control: SampleControl, replica: int, sampler: list[list[int]] | None = None
    ) -> list[list[int]]:
        if control.data == SAMPLER:
            return sampler if sampler is not None else self.derived(replica)
        return [self._read(r) for r in control_positions(control, self.spec, self.sizes[replica])]

    def _read(self, positions: range) -> list[int]:
        # Position-based controls make many replicas read the same samples: read them once.
        key = (positions.start, positions.stop)
        if key not in self._reads:
            self._reads[key] = list(self.epoch[positions.start : positions.stop])
        return self._reads[key]

    def every_replica(self, control: SampleControl) -> list[WeightedBatch]:
        """What all replicas would read under the control, replicas reading alike counted once."""
        spec = self.spec
        out: list[WeightedBatch] = []
        if control.data == SAMPLER and spec.data_parallel_size <= REAL_SAMPLER_MAX_LOCAL_REPLICAS:
            for r in range(spec.data_parallel_size):
                scale = control.loss_scale(spec, self.sizes[r])
                out += [(b, scale, control.loss_reduction(spec), 1) for b in self.derived(r)]
            return out
        if control.data == SAMPLER:
            # One entry per replica group: each sample weighs as its replica's loss weighs it.
            reduction = control.loss_reduction(spec)
            for pool in self.pools(range(spec.data_parallel_size), prove=False):
                scale = control.loss_scale(spec, pool.micro)
                out.append((pool.indices, scale / pool.micro if reduction == "mean" else scale, "sum", 1))
            return out
        alike = Counter(self.sizes)
        for micro, replicas in alike.items():
            scale = control.loss_scale(spec, micro)
            out += [
                (self._read(r), scale, control.loss_reduction(spec), replicas)
                for r in control_positions(control, spec, micro)
            ]
        return out
