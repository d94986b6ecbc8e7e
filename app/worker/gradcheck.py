"""The rank program: one data-parallel training step of a plan, checked against a
single-process gradient over the same global batch.

It imports only torch, the standard library and the pure core, so it runs wherever torch
runs. The warm ranks of the worker call `run_check`; on a cluster torchrun starts it:

    python -m torch.distributed.run --nnodes N --nproc-per-node G --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT -m app.worker.gradcheck --request '{"plan": {...}}' \
        [--model-factory package.module:factory]

and rank 0 prints the result JSON. With --model-factory it trains the user's own model (see
`app.worker.workload`), which is how a model is checked in its own environment.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from app.core import noise_scale
from app.core.model_registry import SYNTHETIC, TARGET, parse_models
from app.worker import equivalence
from app.worker.controls import CONTROLS, SAMPLER, Control, WeightedBatch, changes_gradient, control_positions
from app.worker.model import backward, flat_gradient
from app.worker.samplers import IndexDataset, ProportionalSampler, epoch_indices
from app.worker.spec import CheckSpec, replica_range, replicas_per_process
from app.worker.workload import Workload, load

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
    workload: Workload,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """One step's gradient: every local micro-batch but the last under `no_sync()`, each loss
    times its scale; the last backward lets DDP all-reduce (a mean over processes).

    `factor` = processes / replicas: a process that runs several replicas sums their
    gradients, and DDP's mean over processes then equals the mean over replicas.
    """
    model.zero_grad(set_to_none=True)
    cache: dict[tuple[int, ...], tuple[Any, Any]] = {}
    for i, (indices, scale, reduction) in enumerate(batches):
        key = tuple(indices)
        if key not in cache:
            # Controls that make every replica read the same samples reuse the same tensors.
            cache = {key: workload.batch(indices, dtype, device)}
        x, y = cache[key]
        with nullcontext() if i == len(batches) - 1 else model.no_sync():
            backward(workload.loss(model, x, y, reduction) * (scale * factor))
    return flat_gradient(model.module).detach().clone()


def reference_gradient(
    workload: Workload, batch: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One process, the mean loss over exactly the global batch."""
    model = workload.module(dtype, device)
    x, y = workload.batch(batch, dtype, device)
    backward(workload.loss(model, x, y, "mean"))
    return flat_gradient(model).detach()


def mean_gradient(
    module: torch.nn.Module,
    workload: Workload,
    batches: Sequence[Sequence[int]],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The gradient of the mean loss over `batches`, on the module alone (no all-reduce:
    DDP's hooks ignore a backward that did not go through its forward)."""
    module.zero_grad(set_to_none=True)
    total = sum(len(b) for b in batches)
    for b in batches:
        x, y = workload.batch(b, dtype, device)
        backward(workload.loss(module, x, y, "mean") * (len(b) / total))
    gradient = flat_gradient(module).detach().clone()
    module.zero_grad(set_to_none=True)
    return gradient


def measurement_batches(
    spec: CheckSpec, sizes: Sequence[int], step: int, dataset_size: int | None
) -> list[list[list[int]]]:
    """Step `step`'s micro-batches per replica: a fresh global batch each step (from a seeded
    permutation of the dataset, reshuffled every pass), split as the plan splits it."""
    G, g = spec.global_batch_size, spec.gradient_accumulation_steps
    per_step, offsets = G // g, [0, *accumulate(sizes)]
    if dataset_size is None:
        positions = list(range((step + 1) * G, (step + 2) * G))  # after the check's own batch
    else:
        positions = []
        start = step * G
        while len(positions) < G:
            epoch, at = divmod(start + len(positions), dataset_size)
            order = torch.randperm(
                dataset_size, generator=torch.Generator().manual_seed(spec.seed + 7919 * (epoch + 1))
            )
            take = min(G - len(positions), dataset_size - at)
            positions += order[at : at + take].tolist()
    return [
        [positions[k * per_step + offsets[r] : k * per_step + offsets[r] + sizes[r]] for k in range(g)]
        for r in range(len(sizes))
    ]


def measure_noise_scale(
    model: DistributedDataParallel,
    workload: Workload,
    spec: CheckSpec,
    local: range,
    *,
    factor: float,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, Any] | None:
    """McCandlish et al.'s two-batch estimate over `spec.noise_steps` steps: each replica's
    gradient is a small batch, DDP's all-reduced gradient the big one (with one replica, the
    accumulation steps' micro-batches are the small batches). Rank 0 returns the estimate."""
    sizes = spec.micro_batch_sizes()
    scales = spec.loss_scales()
    dp, g, G = spec.data_parallel_size, spec.gradient_accumulation_steps, spec.global_batch_size
    per_micro = dp == 1
    units = g if per_micro else dp
    steps: list[noise_scale.StepEstimate] = []
    parameters = [p for p in model.module.parameters() if p.requires_grad]
    for step in range(spec.noise_steps):
        batches = measurement_batches(spec, sizes, step, workload.dataset_size)
        small = torch.zeros(units, dtype=torch.float64, device=device)
        samples = torch.zeros(units, dtype=torch.float64, device=device)
        for r in local:
            groups = [[b] for b in batches[r]] if per_micro else [batches[r]]
            for u, group in enumerate(groups):
                unit = u if per_micro else r
                small[unit] = (
                    mean_gradient(model.module, workload, group, dtype, device).double().pow(2).sum()
                )
                samples[unit] = sum(len(b) for b in group)
        dist.all_reduce(small)
        dist.all_reduce(samples)
        step_batches: list[Batch] = [(b, scales[r], spec.loss_reduction) for r in local for b in batches[r]]
        big = ddp_gradient(model, step_batches, factor=factor, workload=workload, dtype=dtype, device=device)
        steps.append(
            noise_scale.step_estimate(
                list(zip(small.tolist(), samples.tolist(), strict=True)), float(big.double().pow(2).sum()), G
            )
        )
        if spec.noise_learning_rate > 0:
            with torch.no_grad():
                for p in parameters:
                    if p.grad is not None:
                        p.sub_(spec.noise_learning_rate * p.grad)
    model.zero_grad(set_to_none=True)
    if dist.get_rank() != 0:
        return None
    result = noise_scale.estimate(steps)
    out: dict[str, Any] = {
        "b_simple": result.b_simple,
        "stderr": result.stderr,
        "relative_stderr": result.relative_stderr,
        "steps": result.steps,
        "decay": result.decay,
        "gradient_sq": result.gradient_sq,
        "trace": result.trace,
        "small_batch": steps[0].small_batch,
        "small_batch_is": "micro_batch" if per_micro else "replica",
        "big_batch": G,
        "learning_rate": spec.noise_learning_rate,
        "history": [
            {"step": k + 1, "gradient_sq": s.gradient_sq, "trace": s.trace, "b_simple": running}
            for k, (s, running) in enumerate(zip(result.history, result.running, strict=True))
        ],
        "critical_batch_size": result.b_simple,
        "efficiency": None,
    }
    if result.b_simple is None:
        out["recommendation"] = (
            f"no estimate: over {result.steps} steps the averaged |G|^2 or tr(S) was not positive, so "
            f"the gradient is lost in the noise at these batch sizes; measure over more steps or "
            f"with a larger global batch"
        )
    else:
        eff = noise_scale.efficiency(G, result.b_simple, result.stderr)
        out["efficiency"] = {
            k: getattr(eff, k)
            for k in (
                "batch_to_critical", "steps_vs_min", "samples_vs_min", "step_efficiency",
                "sample_efficiency", "verdict",
            )
        }  # fmt: skip
        out["recommendation"] = eff.recommendation + (
            "; B_simple approximates the critical batch when the loss curvature is alike in every direction"
        )
    return out


def compare(grad: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    diff = (grad - reference).double()
    norm = float(reference.double().norm())
    max_abs = float(diff.abs().max())
    return max_abs, float(diff.norm()) / norm if norm > 0 else max_abs


def _probe_forward(
    module: torch.nn.Module,
    workload: Workload,
    indices: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> Any:
    x, _ = workload.batch(indices, dtype, device)
    return lambda: module(x)


def fit_micro_batch(
    spec: CheckSpec, workload: Workload, device: torch.device
) -> tuple[CheckSpec, dict[str, Any]]:
    """Rank 0 finds the largest micro-batch that fits in its device's memory (the model in
    its own dtype, a real training step with the optimizer's state); every rank then
    re-plans the same global batch under that cap, with more accumulation if need be."""
    from app.core.errors import PlanError
    from app.worker.memory import find_max_micro_batch
    from app.worker.request import replan

    fit = spec.fit or {}
    # No micro-batch larger than a replica's whole share of a step can help.
    limit = min(
        int(fit.get("max_micro_batch_size", 65536)),
        max(spec.micro_batch_sizes()) * spec.gradient_accumulation_steps,
    )
    found = torch.zeros(1, dtype=torch.int64, device=device)
    report: dict[str, Any] = {}
    if dist.get_rank() == 0:
        module = workload.module(None, device)
        report = find_max_micro_batch(
            module,
            workload.dataset,
            workload.loss_fn,
            device,
            capacity_bytes=fit.get("memory_bytes"),
            safety_margin=float(fit.get("safety_margin", 0.1)),
            limit=limit,
            optimizer=str(fit.get("optimizer", "adam")),
        )
        found[0] = report["max_micro_batch_size"]
        del module
    dist.broadcast(found, src=0)
    cap = int(found)
    if cap == 0:
        raise ValueError(
            f"not even a micro-batch of 1 fits in {fit.get('memory_bytes') or 'the device memory'} bytes "
            f"with a {fit.get('safety_margin', 0.1)} safety margin"
        )
    try:
        fitted = replan(spec, cap)
    except PlanError as err:
        raise ValueError(f"the largest micro-batch that fits is {cap}, and then: {err.detail}") from None
    report.update(
        {
            "search_limit": limit,
            "requested": {
                "micro_batch_sizes": sorted(set(spec.micro_batch_sizes())),
                "gradient_accumulation_steps": spec.gradient_accumulation_steps,
            },
            "planned": {
                "global_batch_size": fitted.global_batch_size,
                "micro_batch_sizes": sorted(set(fitted.micro_batch_sizes())),
                "gradient_accumulation_steps": fitted.gradient_accumulation_steps,
                "max_micro_batch_size": cap,
                "plan_request": fitted.plan_request,
            },
        }
    )
    return fitted, report


def run_check(
    spec: CheckSpec,
    rank: int,
    world: int,
    device: torch.device,
    backend: str,
    nnodes: int = 1,
    workload: Workload | None = None,
) -> dict[str, Any] | None:
    """Run the check on an initialised default process group; rank 0 returns the result."""
    timer = Timer()
    dtype = getattr(torch, spec.dtype)
    workload = workload or load(spec.model, None, spec.seed)
    search = None
    if spec.fit:
        spec, search = fit_micro_batch(spec, workload, device)
        timer.lap("micro_batch_search")
    dp = spec.data_parallel_size
    local = replica_range(rank, world, dp)
    if workload.dataset_size is not None and workload.dataset_size < spec.num_samples:
        raise ValueError(
            f"model {workload.name!r} has {workload.dataset_size} samples; the plan's epoch needs "
            f"{spec.num_samples}: give plan.dataset.num_samples at most {workload.dataset_size}"
        )
    module = workload.module(dtype, device)
    shards = Shards(spec)
    timer.lap("model")
    probe = shards.derived(0)[0]  # the same samples on every rank
    findings = equivalence.static_findings(module, spec)
    unused = equivalence.unused_parameters(
        module, lambda m: backward(workload.loss(m, *workload.batch(probe, dtype, device), "mean"))
    )
    model = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=bool(unused),
    )
    forward = _probe_forward(model.module, workload, probe, dtype, device)
    findings += equivalence.empirical_findings(
        stochastic=equivalence.stochastic_forward(forward, device),
        rank=equivalence.rank_difference(forward, device),
        processes=world,
        unused=unused,
        known=findings,
    )
    timer.lap("ddp")
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

    def step(control: Control | None) -> torch.Tensor:
        return ddp_gradient(
            model, local_batches(control), factor=factor, workload=workload, dtype=dtype, device=device
        )

    grad = step(None)
    timer.lap("step")
    reference_batch = shards.epoch[: spec.global_batch_size]
    applicable, skipped = [], []
    for control in CONTROLS:
        if changes_gradient(shards.every_replica(control), reference_batch, dp):
            applicable.append(control)
        else:
            skipped.append(control.name)
    control_grads = [step(c) for c in applicable]
    timer.lap("controls")
    noise = None
    if spec.noise_steps > 0:
        noise = measure_noise_scale(model, workload, spec, local, factor=factor, dtype=dtype, device=device)
        timer.lap("noise_scale")
    if rank != 0:
        return None
    reference = reference_gradient(workload, reference_batch, dtype, device)
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
    equivalent = equivalence.verdict(findings, held, rel, tolerance)
    result: dict[str, Any] = {
        "passed": held and all_detected and equivalent["equivalent"],
        "gradient_matches": held,
        "controls_detected": all_detected,
        "model": workload.name,
        "ddp_equivalence": equivalent,
        "backend": backend,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": spec.dtype,
        "nnodes": nnodes,
        "processes": world,
        "data_parallel_size": dp,
        "replicas_per_process": replicas_per_process(world, dp),
        "global_batch_size": spec.global_batch_size,
        "micro_batch_sizes": sorted(set(shards.sizes)),
        "gradient_accumulation_steps": spec.gradient_accumulation_steps,
        "split": spec.split,
        "max_abs_diff": max_abs,
        "rel_l2": rel,
        "tolerance": tolerance,
        "controls": controls,
        "controls_not_applicable": skipped,
        "noise_scale": noise,
        "micro_batch_search": search,
        "timings_s": {**timer.laps, "rank_total": timer.total()},
        "torch_version": torch.__version__,
    }
    return result


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


def _model_target(requested: str | None, factory: str | None) -> tuple[str, str | None]:
    """(name, target): a factory given on the command line, else the request's model as
    this environment's BATCHPLAN_CHECK_MODELS registers it."""
    if factory:
        if not TARGET.match(factory):
            raise SystemExit(f"error: --model-factory {factory!r} is not package.module:factory")
        return factory, factory
    name = requested or SYNTHETIC
    if name == SYNTHETIC:
        return name, None
    return name, parse_models(os.environ.get("BATCHPLAN_CHECK_MODELS", "")).get(name)


def torchrun_argv(
    request: str,
    *,
    nproc_per_node: int,
    rdzv_endpoint: str,
    nnodes: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command that runs this program under torchrun on one node of a check (the one
    spelled in the module docstring); rank 0 prints the result JSON. `extra`: more of this
    program's options (--model-factory, --timeout-s)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
        "-m", "app.worker.gradcheck", "--request", request, *extra,
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
    parser.add_argument(
        "--model-factory",
        metavar="PACKAGE.MODULE:FACTORY",
        help="train this factory's (model, dataset, loss_fn) instead of the request's model",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    data = _read_request(args)
    name, target = _model_target(data.get("model"), args.model_factory)
    if target is None and name != SYNTHETIC:
        print(
            f"error: model {name!r} is not in BATCHPLAN_CHECK_MODELS here; give --model-factory",
            file=sys.stderr,
        )
        return 2
    spec = dataclasses.replace(spec_from_request(data, registered=target is not None), model=name)
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
        workload = load(name, target, spec.seed)
        result = run_check(
            spec, rank, world, device, backend, nnodes=max(1, world // local_world), workload=workload
        )
    finally:
        dist.destroy_process_group()
    if result is not None:
        result["timings_s"]["init_process_group"] = round(setup, 6)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
