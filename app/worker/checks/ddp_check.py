"""The data-parallel check: one DDP training step of a plan, checked against a
single-process gradient over the same global batch, with deliberately wrong setups
(controls) that the comparison must catch.

Runs on an initialised default process group: the warm ranks of the worker call
`run_check`, and so does the rank program under torchrun (`app.worker.gradcheck`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The first DDP construction imports torch._dynamo (seconds): importing it here moves the
# cost to the fork server, before any check.
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel

from app.worker.checks import equivalence
from app.worker.checks import equivalence_probes as probes
from app.worker.checks.controls import Control, split_controls
from app.worker.checks.result_parts import TOLERANCE, check_layout, check_setup, judged_controls
from app.worker.checks.shards import Shards
from app.worker.contract.check_result import CheckResult, Comparison
from app.worker.contract.spec import CheckSpec, replica_range
from app.worker.contract.timings import Timer
from app.worker.measure.micro_batch_fit import fit_micro_batch
from app.worker.measure.noise_measurement import distrust, measure_noise_scale, not_equivalent_reason
from app.worker.training.gradients import Batch, compare, ddp_gradient, reference_gradient
from app.worker.training.sync_batch_norm import cpu_refusal, training_sync_batch_norms
from app.worker.training.synthetic_model import backward
from app.worker.training.workload import Workload, load, model_code


def _probe_forward(
    module: torch.nn.Module,
    workload: Workload,
    indices: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> Any:
    x, _ = workload.batch(indices, dtype, device)
    return lambda: workload.forward(module, x)


def run_check(
    spec: CheckSpec,
    rank: int,
    world: int,
    device: torch.device,
    backend: str,
    nnodes: int = 1,
    workload: Workload | None = None,
) -> CheckResult | None:
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
    synced = training_sync_batch_norms(module)
    if synced and device.type != "cuda":
        with model_code():  # refused before any collective: the ranks stay usable
            raise ValueError(cpu_refusal(synced))
    shards = Shards(spec)
    timer.lap("model")
    probe = shards.derived(0)[0]  # the same samples on every rank
    findings = equivalence.static_findings(module, spec, processes=world, own_loss=workload.own_loss)

    def backward_once(m: torch.nn.Module) -> None:
        backward(workload.loss(m, *workload.batch(probe, dtype, device), "mean"))

    unused = probes.unused_parameters(module, backward_once)
    gradient_spread = probes.stochastic_gradient(module, backward_once)
    model = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=bool(unused),
    )
    forward = _probe_forward(model.module, workload, probe, dtype, device)
    stochastic = max(probes.stochastic_forward(forward, device), gradient_spread)
    draws: list[str] = []
    if stochastic > probes.different(spec.dtype):
        alone = workload.single_process_module(dtype, device)  # no collectives in its forward
        draws = probes.random_draws(_probe_forward(alone, workload, probe, dtype, device), alone, device)
    findings += equivalence.empirical_findings(
        stochastic=stochastic,
        rank=probes.rank_difference(forward, device),
        processes=world,
        unused=unused,
        known=findings,
        dtype=spec.dtype,
        draws=draws,
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
    applicable, skipped = split_controls(spec, shards.every_replica, reference_batch)
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
    gradient = Comparison(*compare(grad, reference), tolerance=tolerance)
    runs = zip(applicable, control_grads, strict=True)
    controls = judged_controls(((c.name, c.description, g) for c, g in runs), reference, tolerance)
    judged = equivalence.verdict(findings, gradient.matches, gradient.rel_l2, tolerance)
    if noise is not None and not judged["equivalent"]:
        noise = distrust(noise, [not_equivalent_reason(judged["summary"])])
    return CheckResult(
        model=workload.name,
        ddp_equivalence=judged,
        setup=check_setup(backend, device, spec.dtype, nnodes, world),
        layout=check_layout(spec, world, shards.sizes),
        gradient=gradient,
        controls=controls,
        controls_skipped=tuple(skipped),
        sampler_checked=shards.sampler_checked,
        noise_scale=noise,
        micro_batch_search=search,
        timings=timer.timings(),
        torch_version=torch.__version__,
    )
