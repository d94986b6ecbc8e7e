"""Which samples each replica reads in a check's first optimizer step: through the plan's
real sampler, derived from the epoch's index list, and under each control.

Everything a first step reads lies in the epoch's first G positions (G the global batch):
replica r's shard starts at position r, micro-step k of a proportional split at k·S, and the
controls read the leading samples. So a check holds those G indices, never the epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import accumulate

from torch.utils.data import DataLoader

from app.contract.spec import CheckSpec
from app.worker.checks.controls import SAMPLER, SampleControl, WeightedBatch, control_positions
from app.worker.training import samplers
from app.worker.training.samplers import EpochOrder, IndexDataset, plan_sampler

# DistributedSampler builds the whole epoch as a Python list (about 40 bytes a sample) on every
# call (10 MiB at this size): up to it a check reads its first replica through it; beyond, through the same
# layout derived from the same torch.randperm (which tests hold against DistributedSampler).
REAL_SAMPLER_MAX_SAMPLES = 1 << 18


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
        if control.data == SAMPLER:
            for r in range(spec.data_parallel_size):
                scale = control.loss_scale(spec, self.sizes[r])
                out += [(b, scale, control.loss_reduction(spec), 1) for b in self.derived(r)]
            return out
        alike = Counter(self.sizes)
        for micro, replicas in alike.items():
            scale = control.loss_scale(spec, micro)
            out += [
                (self._read(r), scale, control.loss_reduction(spec), replicas)
                for r in control_positions(control, spec, micro)
            ]
        return out
