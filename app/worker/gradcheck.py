"""The rank program: one data-parallel training step of a plan, checked against a
single-process gradient over the same global batch.

It imports only torch, the standard library and the pure core, so it runs wherever torch
runs. The warm ranks of the worker call `run_check`; on a cluster torchrun starts it:

    python -m torch.distributed.run --nnodes N --nproc-per-node G --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT -m app.worker.gradcheck --request '{"plan": {...}}'

and rank 0 prints the result JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from datetime import timedelta
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch

# The first DDP construction imports torch._dynamo (seconds): importing it here moves the
# cost to the fork server, before any check.
import torch._dynamo
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from app.worker.controls import CONTROLS, SAMPLER, Control, WeightedBatch, changes_gradient, control_positions
from app.worker.model import backward, batch_loss, build_model, flat_gradient, synthetic_batch
from app.worker.samplers import IndexDataset, ProportionalSampler, epoch_indices
from app.worker.spec import CheckSpec, replica_range, replicas_per_process

# float64 on CPU agrees to ~1e-16 relative, float32 to ~1e-7; a wrong setup is off by 1e-1 or more.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
# A control counts as detected only this far above the tolerance, so the verdict is clear.
DETECTION_FACTOR = 100

Batch = tuple[Sequence[int], float, str]  # sample indices, loss scale, reduction


class Timer:
    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.last, 6)
        self.last = now

    def total(self) -> float:
        return round(time.perf_counter() - self.started, 6)


def choose_backend(requested: str, local_processes: int, local_index: int) -> tuple[str, torch.device]:
    """NCCL with one rank per GPU when this host has a GPU for every local rank, else gloo on CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_nccl_available() and gpus >= local_processes
    if requested == "nccl" and not nccl:
        raise RuntimeError(f"backend nccl needs {local_processes} GPUs on this host; it has {gpus}")
    if requested != "gloo" and nccl:
        return "nccl", torch.device("cuda", local_index)
    return "gloo", torch.device("cpu")


def _chunks(indices: Sequence[int], size: int, count: int) -> list[list[int]]:
    return [list(indices[k * size : (k + 1) * size]) for k in range(count)]


class Shards:
    """The first optimizer step's micro-batches of every replica, by the plan's sampler."""

    def __init__(self, spec: CheckSpec) -> None:
        self.spec = spec
        self.sizes = spec.micro_batch_sizes()
        self.scales = spec.loss_scales()
        self.offsets = [0, *accumulate(self.sizes)]
        self.epoch = epoch_indices(spec.num_samples, spec.total_size, spec.shuffle, spec.data_seed, 0)
        self._reads: dict[tuple[int, int], list[int]] = {}
        self._derived: dict[int, list[list[int]]] = {}

    def derived(self, replica: int) -> list[list[int]]:
        """The sampler's output computed from the epoch list, for emulated replicas and for
        deciding which controls apply; `through_sampler` checks it against the real one."""
        if replica not in self._derived:
            spec, g, micro = self.spec, self.spec.gradient_accumulation_steps, self.sizes[replica]
            if spec.split == "even":
                shard = self.epoch[replica : spec.total_size : spec.data_parallel_size]
                self._derived[replica] = _chunks(shard, micro, g)
            else:
                per_step, start = self.offsets[-1], self.offsets[replica]
                self._derived[replica] = [
                    list(self.epoch[k * per_step + start : k * per_step + start + micro]) for k in range(g)
                ]
        return self._derived[replica]

    def through_sampler(self, replica: int) -> list[list[int]]:
        """What a DataLoader over the plan's sampler yields for the first optimizer step."""
        spec = self.spec
        sampler: DistributedSampler[int] | ProportionalSampler
        if spec.split == "even":
            sampler = DistributedSampler(
                IndexDataset(spec.num_samples),
                num_replicas=spec.data_parallel_size,
                rank=replica,
                shuffle=spec.shuffle,
                seed=spec.data_seed,
                drop_last=spec.drop_last,
            )
        else:
            sampler = ProportionalSampler(
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
            out[replica] = self.through_sampler(replica) if real else self.derived(replica)
        return out

    def control_batches(
        self, control: Control, replica: int, sampler: list[list[int]] | None = None
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

    def every_replica(self, control: Control) -> list[WeightedBatch]:
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


def ddp_gradient(
    model: DistributedDataParallel,
    batches: Sequence[Batch],
    *,
    factor: float,
    spec: CheckSpec,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """One step's gradient: every local micro-batch but the last under `no_sync()`, each loss
    times its scale; the last backward lets DDP all-reduce (a mean over processes).

    `factor` = processes / replicas: a process that runs several replicas sums their
    gradients, and DDP's mean over processes then equals the mean over replicas.
    """
    model.zero_grad(set_to_none=True)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
    for i, (indices, scale, reduction) in enumerate(batches):
        key = tuple(indices)
        if key not in cache:
            # Controls that make every replica read the same samples reuse the same tensors.
            cache = {key: synthetic_batch(torch.tensor(indices, dtype=torch.int64), spec.seed, dtype, device)}
        x, y = cache[key]
        with nullcontext() if i == len(batches) - 1 else model.no_sync():
            backward(batch_loss(model, x, y, reduction) * (scale * factor))
    return flat_gradient(model.module).detach().clone()


def reference_gradient(
    spec: CheckSpec, batch: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One process, the mean loss over exactly the global batch."""
    model = build_model(spec.seed, dtype, device)
    x, y = synthetic_batch(torch.tensor(list(batch), dtype=torch.int64), spec.seed, dtype, device)
    backward(batch_loss(model, x, y, "mean"))
    return flat_gradient(model).detach()


def compare(grad: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    diff = (grad - reference).double()
    norm = float(reference.double().norm())
    max_abs = float(diff.abs().max())
    return max_abs, float(diff.norm()) / norm if norm > 0 else max_abs


def run_check(
    spec: CheckSpec, rank: int, world: int, device: torch.device, backend: str, nnodes: int = 1
) -> dict[str, Any] | None:
    """Run the check on an initialised default process group; rank 0 returns the result."""
    timer = Timer()
    dtype = getattr(torch, spec.dtype)
    dp = spec.data_parallel_size
    local = replica_range(rank, world, dp)
    model = DistributedDataParallel(
        build_model(spec.seed, dtype, device), device_ids=[device.index] if device.type == "cuda" else None
    )
    timer.lap("ddp")
    shards = Shards(spec)
    sampled = shards.local(local)
    timer.lap("data")
    factor = world / dp

    def local_batches(control: Control | None) -> list[Batch]:
        out: list[Batch] = []
        for r in local:
            if control is None:
                out += [(b, shards.scales[r], spec.loss_reduction) for b in sampled[r]]
            else:
                scale = float(control.loss_scale(spec, shards.sizes[r]))
                out += [
                    (b, scale, control.loss_reduction(spec))
                    for b in shards.control_batches(control, r, sampled[r])
                ]
        return out

    grad = ddp_gradient(model, local_batches(None), factor=factor, spec=spec, dtype=dtype, device=device)
    timer.lap("step")
    reference_batch = shards.epoch[: spec.global_batch_size]
    applicable, skipped = [], []
    for control in CONTROLS:
        if changes_gradient(shards.every_replica(control), reference_batch, dp):
            applicable.append(control)
        else:
            skipped.append(control.name)
    control_grads = [
        ddp_gradient(model, local_batches(c), factor=factor, spec=spec, dtype=dtype, device=device)
        for c in applicable
    ]
    timer.lap("controls")
    if rank != 0:
        return None
    reference = reference_gradient(spec, reference_batch, dtype, device)
    timer.lap("reference")
    tolerance = TOLERANCE[spec.dtype]
    max_abs, rel = compare(grad, reference)
    controls = []
    for control, control_grad in zip(applicable, control_grads, strict=True):
        c_abs, c_rel = compare(control_grad, reference)
        controls.append(
            {
                "name": control.name,
                "description": control.description,
                "rel_l2": c_rel,
                "max_abs_diff": c_abs,
                "detected": c_rel > DETECTION_FACTOR * tolerance,
            }
        )
    held = math.isfinite(rel) and rel <= tolerance
    all_detected = all(c["detected"] for c in controls)
    return {
        "passed": held and all_detected,
        "gradient_matches": held,
        "controls_detected": all_detected,
        "backend": backend,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": spec.dtype,
        "nnodes": nnodes,
        "processes": world,
        "data_parallel_size": dp,
        "replicas_per_process": replicas_per_process(world, dp),
        "global_batch_size": spec.global_batch_size,
        "gradient_accumulation_steps": spec.gradient_accumulation_steps,
        "split": spec.split,
        "max_abs_diff": max_abs,
        "rel_l2": rel,
        "tolerance": tolerance,
        "controls": controls,
        "controls_not_applicable": skipped,
        "timings_s": {**timer.laps, "rank_total": timer.total()},
        "torch_version": torch.__version__,
    }


def _read_request(args: argparse.Namespace) -> dict[str, Any]:
    if args.request_file:
        text = sys.stdin.read() if args.request_file == "-" else Path(args.request_file).read_text()
    else:
        text = args.request
    data: dict[str, Any] = json.loads(text)
    for key in ("backend", "dtype", "seed"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    return data


def torchrun_argv(request: str, *, nproc_per_node: int, rdzv_endpoint: str, nnodes: int = 1) -> list[str]:
    """The command that runs this program under torchrun on one node of a check (the one
    spelled in the module docstring); rank 0 prints the result JSON."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
        "-m", "app.worker.gradcheck", "--request", request,
    ]  # fmt: skip


def main(argv: Iterator[str] | None = None) -> int:
    """Entry point under torchrun: rank, world and rendezvous come from its environment."""
    from app.worker.request import spec_from_request

    parser = argparse.ArgumentParser(
        prog="python -m app.worker.gradcheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--request", help="the check request JSON, as POST /v1/checks takes it")
    source.add_argument("--request-file", help="a file holding it, or - for stdin")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--dtype", choices=["float64", "float32"])
    parser.add_argument("--seed", type=int)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args(list(argv) if argv is not None else None)
    spec = spec_from_request(_read_request(args))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world > spec.data_parallel_size:
        print(
            f"error: {world} processes for {spec.data_parallel_size} replicas; start at most "
            f"{spec.data_parallel_size}",
            file=sys.stderr,
        )
        return 2
    backend, device = choose_backend(spec.backend, local_world, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    setup = time.perf_counter() - started
    try:
        result = run_check(spec, rank, world, device, backend, nnodes=max(1, world // local_world))
    finally:
        dist.destroy_process_group()
    if result is not None:
        result["timings_s"]["init_process_group"] = round(setup, 6)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
