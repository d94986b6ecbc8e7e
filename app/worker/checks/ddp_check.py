"""The data-parallel check: one DDP training step of a plan, checked against a
single-process gradient over the same global batch, with deliberately wrong setups
(controls) that the comparison must catch.

Runs on an initialised default process group: the warm ranks of the worker call
`run_ddp_check` (through check_kinds), and so does the rank program under torchrun.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The first DDP construction imports torch._dynamo (seconds): importing it here moves the
# cost to the fork server, before any check.
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel

from app.contract.check_result import CheckResult
from app.contract.spec import CheckSpec, replica_range
from app.contract.timings import Timer
from app.worker.checks import equivalence
from app.worker.checks import probe_answers as answers
from app.worker.checks.controls import SampleControl, weigh_controls
from app.worker.checks.result_parts import CheckGroup, Measured, judged_result
from app.worker.checks.shards import Shards
from app.worker.measure.micro_batch_fit import fit_micro_batch
from app.worker.measure.noise_measurement import measure_noise_scale
from app.worker.training.gradients import Batch, ddp_gradient, reference_gradient, weighted_gradients
from app.worker.training.sync_batch_norm import cpu_refusal, forward_is_collective, training_sync_batch_norms
from app.worker.training.workload import Workload, load, model_code


def run_ddp_check(spec: CheckSpec, group: CheckGroup, workload: Workload | None = None) -> CheckResult | None:
    """Run the check on an initialised default process group; rank 0 returns the result."""
    timer = Timer()
    dtype, device = getattr(torch, spec.dtype), group.device
    workload = workload or load(spec.model, None, spec.seed)
    search = None
    if spec.fit:
        spec, search = fit_micro_batch(spec, workload, device)
        timer.lap("micro_batch_search")
    module = workload.module(dtype, device)
    _refuse_what_cannot_run(spec, workload, module, device)
    shards = Shards(spec)
    timer.lap("model")
    model, findings = _wrapped(module, workload, spec, shards.derived(0)[0], group)
    timer.lap("ddp")
    local = replica_range(group.rank, group.world, spec.data_parallel_size)
    sampled = shards.local(local)
    timer.lap("data")

    def step(control: SampleControl | None) -> torch.Tensor:
        batches = _local_batches(spec, shards, sampled, control)
        factor = group.world / spec.data_parallel_size
        return ddp_gradient(model, batches, factor=factor, workload=workload, dtype=dtype, device=device)

    def controls_step(model: DistributedDataParallel, controls: list[SampleControl]) -> list[torch.Tensor]:
        if forward_is_collective(model.module):
            return [step(c) for c in controls]
        # A workload's sum over a batch's samples is its mean times their number: controls that
        # read the same micro-batch summed and averaged share its one backward.
        runs = [
            [(b, scale * len(b), "mean") if r == "sum" else (b, scale, r) for b, scale, r in batches]
            for batches in (_local_batches(spec, shards, sampled, c) for c in controls)
        ]
        factor = group.world / spec.data_parallel_size
        return weighted_gradients(
            model.module, runs, factor=factor, workload=workload, dtype=dtype, device=device
        )

    grad = step(None)
    timer.lap("step")
    reference_batch = shards.epoch[: spec.global_batch_size]
    applicable, skipped, ratios = weigh_controls(spec, shards.every_replica, reference_batch)
    # A control that weighs every sample c times as the reference does is c times the
    # reference gradient where samples are independent of each other (the built-in model):
    # rank 0 scales the reference below, and no rank runs a pass for it.
    if not workload.independent_samples:
        ratios = {}
    passes = [c for c in applicable if c not in ratios]
    computed = dict(zip(passes, controls_step(model, passes), strict=True))
    timer.lap("controls")
    noise = None
    if spec.noise_steps > 0:
        factor = group.world / spec.data_parallel_size
        noise = measure_noise_scale(model, workload, spec, local, factor=factor, dtype=dtype, device=device)
        timer.lap("noise_scale")
    if group.rank != 0:
        return None
    reference = reference_gradient(workload, reference_batch, dtype, device)
    control_grads = [(c, computed[c] if c in computed else reference * float(ratios[c])) for c in applicable]
    timer.lap("reference")
    measured = Measured(
        grad, reference, control_grads, skipped, findings, shards.sampler_checked, shards.sizes
    )
    return judged_result(spec, group, workload.name, measured, timer, noise=noise, search=search)


def _refuse_what_cannot_run(
    spec: CheckSpec, workload: Workload, module: torch.nn.Module, device: torch.device
) -> None:
    if workload.dataset_size is not None and workload.dataset_size < spec.num_samples:
        raise ValueError(
            f"model {workload.name!r} has {workload.dataset_size} samples; the plan's epoch needs "
            f"{spec.num_samples}: give plan.dataset.num_samples at most {workload.dataset_size}"
        )
    synced = training_sync_batch_norms(module)
    if synced and device.type != "cuda":
        with model_code():  # refused before any collective: the ranks stay usable
            raise ValueError(cpu_refusal(synced))


def _wrapped(
    module: torch.nn.Module, workload: Workload, spec: CheckSpec, probe: Sequence[int], group: CheckGroup
) -> tuple[DistributedDataParallel, list[dict[str, Any]]]:
    """The module under DDP, and what it shows about DDP equivalence: its module tree, and
    runs of it on `probe` (the same samples on every rank) for randomness, rank dependence
    and unused parameters; answers a warm rank kept for this model are used when every rank
    kept them (probe_answers says when)."""
    dtype, device = getattr(torch, spec.dtype), group.device
    findings = equivalence.static_findings(module, spec, processes=group.world, own_loss=workload.own_loss)
    key = answers.key_of(dtype, device, probe, group.rank, group.world)
    found = answers.kept(workload, key, device)
    local = (
        found.local
        if found is not None
        else answers.local_probes(module, answers.probe_backward(workload, probe, dtype, device))
    )
    model = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=bool(local.unused),
    )
    if found is None:
        found = answers.wrapped_probes(
            model.module, workload, probe, local, dtype=dtype, dtype_name=spec.dtype, device=device
        )
        answers.keep(workload, key, found)
    findings += equivalence.empirical_findings(
        stochastic=found.stochastic,
        rank=found.rank,
        processes=group.world,
        unused=list(found.local.unused),
        known=findings,
        dtype=spec.dtype,
        draws=list(found.draws),
    )
    return model, findings


def _local_batches(
    spec: CheckSpec, shards: Shards, sampled: dict[int, list[list[int]]], control: SampleControl | None
) -> list[Batch]:
    """This rank's micro-batches of the step, each with its loss scale and reduction: the
    plan's, or those of a control's mistake."""
    out: list[Batch] = []
    for r, batches in sampled.items():
        if control is None:
            out += [(b, shards.scales[r], spec.loss_reduction) for b in batches]
        else:
            scale = float(control.loss_scale(spec, shards.sizes[r]))
            out += [
                (b, scale, control.loss_reduction(spec)) for b in shards.control_batches(control, r, batches)
            ]
    return out
