"""The gradient noise scale measured on the check's DDP model: over fresh global batches, each
replica's (or micro-batch's) gradient is a small batch and DDP's all-reduced one the big one;
the arithmetic is the pure `app.core.learning_rate.noise_scale`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from app.contract.noise_scale import NoiseEfficiency, NoiseScaleReport, NoiseStep
from app.contract.spec import CheckSpec
from app.core.learning_rate import noise_scale
from app.worker.training.gradients import Batch, BatchFeed, ddp_gradient, mean_gradient


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
    model: DistributedDataParallel, spec: CheckSpec, local: range, feed: BatchFeed
) -> NoiseScaleReport | None:
    """McCandlish et al.'s two-batch estimate over `spec.noise_steps` steps: each replica's
    gradient is a small batch, DDP's all-reduced gradient the big one (with one replica, the
    accumulation steps' micro-batches are the small batches). Rank 0 returns the estimate."""
    steps = [_step_estimate(model, spec, local, step, feed) for step in range(spec.noise_steps)]
    model.zero_grad(set_to_none=True)
    if dist.get_rank() != 0:
        return None
    return _report(spec, steps)


def _step_estimate(
    model: DistributedDataParallel, spec: CheckSpec, local: range, step: int, feed: BatchFeed
) -> noise_scale.StepEstimate:
    """One step's |G|^2 at the small and the big batch (a collective: every rank calls it),
    then the SGD step between measurements, if any."""
    workload, dtype, device = feed.workload, feed.dtype, feed.device
    sizes, scales = spec.micro_batch_sizes(), spec.loss_scales()
    per_micro = spec.data_parallel_size == 1
    units = spec.gradient_accumulation_steps if per_micro else spec.data_parallel_size
    batches = measurement_batches(spec, sizes, step, workload.dataset_size)
    small = torch.zeros(units, dtype=torch.float64, device=device)
    samples = torch.zeros(units, dtype=torch.float64, device=device)
    for r in local:
        groups = [[b] for b in batches[r]] if per_micro else [batches[r]]
        for u, group in enumerate(groups):
            unit = u if per_micro else r
            small[unit] = mean_gradient(model.module, workload, group, dtype, device).double().pow(2).sum()
            samples[unit] = sum(len(b) for b in group)
    dist.all_reduce(small)
    dist.all_reduce(samples)
    step_batches: list[Batch] = [(b, scales[r], spec.loss_reduction) for r in local for b in batches[r]]
    big = ddp_gradient(model, step_batches, feed)
    estimate = noise_scale.step_estimate(
        list(zip(small.tolist(), samples.tolist(), strict=True)),
        float(big.double().pow(2).sum()),
        spec.global_batch_size,
    )
    if spec.noise_learning_rate > 0:
        with torch.no_grad():
            for p in model.module.parameters():
                if p.requires_grad and p.grad is not None:
                    p.sub_(spec.noise_learning_rate * p.grad)
    return estimate


def _report(spec: CheckSpec, steps: list[noise_scale.StepEstimate]) -> NoiseScaleReport:
    """The estimate over the steps, with a recommendation only where it can be trusted."""
    G = spec.global_batch_size
    result = noise_scale.estimate(steps)
    reasons = noise_scale.doubts(result)
    efficiency: NoiseEfficiency | None = None
    recommendation = ""  # with reasons, `distrusted` says why there is none
    if result.b_simple is None:
        recommendation = (
            f"no estimate: over {result.steps} steps the averaged |G|^2 or tr(S) was not positive, so "
            f"the gradient is lost in the noise at these batch sizes; measure over more steps or "
            f"with a larger global batch"
        )
    elif not reasons:
        eff = noise_scale.efficiency(G, result.b_simple, result.stderr)
        efficiency = NoiseEfficiency(
            eff.batch_to_critical,
            eff.steps_vs_min,
            eff.samples_vs_min,
            eff.step_efficiency,
            eff.sample_efficiency,
            eff.verdict,
        )
        recommendation = eff.recommendation + (
            "; B_simple approximates the critical batch when the loss curvature is alike in every direction"
        )
    report = NoiseScaleReport(
        b_simple=result.b_simple,
        stderr=result.stderr,
        relative_stderr=result.relative_stderr,
        steps=result.steps,
        decay=result.decay,
        gradient_sq=result.gradient_sq,
        trace=result.trace,
        small_batch=steps[0].small_batch,
        small_batch_is="micro_batch" if spec.data_parallel_size == 1 else "replica",
        big_batch=G,
        learning_rate=spec.noise_learning_rate,
        history=tuple(
            NoiseStep(k + 1, s.gradient_sq, s.trace, running)
            for k, (s, running) in enumerate(zip(result.history, result.running, strict=True))
        ),
        critical_batch_size=result.b_simple,
        efficiency=efficiency,
        recommendation=recommendation,
    )
    return report.distrusted(reasons) if reasons else report


def not_equivalent_reason(summary: str) -> str:
    """Why a model that is not DDP-equivalent has no noise scale worth the name."""
    return (
        f"the model is {summary}: its small- and large-batch gradients are different functions "
        f"(with batch norm each is normalised over its own batch), so their difference is not "
        f"gradient noise"
    )
