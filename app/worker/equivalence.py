"""Why a model is or is not DDP-equivalent at a planned split: the DDP step's gradient equals
the single-process gradient of the global batch only when each sample's gradient depends on
nothing but that sample and the weights.

Four known causes are looked for, each both in the module tree and by running the model:
BatchNorm (statistics over each micro-batch, not the global batch), dropout or any other
randomness in the forward pass, layers that behave differently on different ranks, and
parameters that the forward pass does not use (DDP's default then fails at the next step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from app.worker.spec import CheckSpec

# Outputs this far apart (relative to their size) are different, whatever the dtype.
DIFFERENT = 1e-6
_PROBE_SEED = 20_181_214  # any fixed value: every rank draws the same random numbers


def _finding(cause: str, modules: list[str], detail: str, fix: str, breaks: bool) -> dict[str, Any]:
    return {
        "cause": cause,
        "modules": modules[:20],
        "detail": detail,
        "fix": fix,
        "breaks_equivalence": breaks,
    }


def static_findings(module: nn.Module, spec: CheckSpec) -> list[dict[str, Any]]:
    """What the module tree shows, judged at the plan's split."""
    out = []
    micro = min(spec.micro_batch_sizes())
    g, G = spec.gradient_accumulation_steps, spec.global_batch_size
    plain = [
        n or "(root)"
        for n, m in module.named_modules()
        if isinstance(m, _BatchNorm) and not isinstance(m, nn.SyncBatchNorm) and m.training
    ]
    synced = [
        n or "(root)" for n, m in module.named_modules() if isinstance(m, nn.SyncBatchNorm) and m.training
    ]
    if plain:
        out.append(
            _finding(
                "batch_norm",
                plain,
                f"{len(plain)} BatchNorm layer(s) in training mode normalise each micro-batch of {micro} "
                f"samples with its own mean and variance; the single-process step normalises all {G} "
                f"together, so every sample's gradient depends on which others share its micro-batch",
                "use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (NCCL on GPUs) with no gradient "
                "accumulation, or GroupNorm/LayerNorm, which normalise each sample on its own",
                breaks=micro < G,
            )
        )
    if synced:
        out.append(
            _finding(
                "batch_norm",
                synced,
                f"SyncBatchNorm shares statistics across replicas, but each of the {g} accumulation "
                f"steps still normalises only {G // g} of the {G} samples",
                "plan without gradient accumulation (more replicas or a larger micro-batch), or use "
                "GroupNorm/LayerNorm",
                breaks=g > 1,
            )
        )
    dropout = [n for n, m in module.named_modules() if isinstance(m, _DropoutNd) and m.training and m.p > 0]
    attention = [
        n
        for n, m in module.named_modules()
        if isinstance(m, nn.MultiheadAttention) and m.training and float(getattr(m, "dropout", 0.0)) > 0
    ]
    if dropout or attention:
        out.append(
            _finding(
                "dropout",
                [n or "(root)" for n in dropout + attention],
                f"{len(dropout) + len(attention)} dropout layer(s) with p > 0 draw a random mask per "
                f"forward pass: each replica (and the single-process step) draws different masks",
                "run the check with dropout off (model.eval() for those layers, or p=0) to prove the "
                "split; in training, dropout is expected noise, not a batching error",
                breaks=True,
            )
        )
    return out


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


def _flat_output(forward: Callable[[], Any], seed: int, device: torch.device) -> torch.Tensor:
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        parts = [t.detach().reshape(-1).double() for t in _tensors(forward()) if t.is_floating_point()]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=device)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(b.abs().max()) if b.numel() else 0.0, 1e-30)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0


def stochastic_forward(forward: Callable[[], Any], device: torch.device) -> float:
    """How far two forward passes of the same input under different random states differ."""
    return _relative(
        _flat_output(forward, _PROBE_SEED, device), _flat_output(forward, _PROBE_SEED + 1, device)
    )


def rank_difference(forward: Callable[[], Any], device: torch.device) -> float:
    """The largest difference from rank 0's output of the same input and random state, over
    all ranks (a collective: every rank calls it and gets the same answer)."""
    mine = _flat_output(forward, _PROBE_SEED, device)
    size = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    sizes = size.clone()
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
    floor = size.clone()
    dist.all_reduce(floor, op=dist.ReduceOp.MIN)
    if int(sizes) != int(floor):
        return float("inf")  # the output's shape itself depends on the rank
    leader = mine.clone()
    dist.broadcast(leader, src=0)
    diff = torch.tensor([_relative(mine, leader)], dtype=torch.float64, device=device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff)


def unused_parameters(module: nn.Module, backward_once: Callable[[nn.Module], None]) -> list[str]:
    """Trainable parameters that get no gradient from one backward pass (grads cleared after)."""
    module.zero_grad(set_to_none=True)
    backward_once(module)
    names = [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
    module.zero_grad(set_to_none=True)
    return names


def empirical_findings(
    *, stochastic: float, rank: float, processes: int, unused: list[str], known: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    causes = {f["cause"] for f in known}
    if stochastic > DIFFERENT and "dropout" not in causes:
        out.append(
            _finding(
                "stochastic_forward",
                [],
                f"the same input under another random state gives outputs {stochastic:.3g} apart "
                f"(relative): the forward pass draws random numbers (functional dropout, noise, sampling)",
                "turn the randomness off for the check (a flag in the factory), or seed it per sample",
                breaks=True,
            )
        )
    if rank > DIFFERENT:
        out.append(
            _finding(
                "rank_dependent",
                [],
                f"the same input and random state give outputs {rank:.3g} apart (relative) on different "
                f"ranks: a layer depends on the rank (dist.get_rank(), the RANK variable, per-rank "
                f"tensors that are not registered parameters or buffers)",
                "make every rank compute the same function; keep per-rank state in registered buffers "
                "(DDP broadcasts them from rank 0) or out of the model",
                breaks=True,
            )
        )
    if unused:
        out.append(
            _finding(
                "unused_parameters",
                unused,
                f"{len(unused)} trainable parameter(s) get no gradient in the forward pass: DDP's "
                f"default (find_unused_parameters=False) waits for them and fails at the next step "
                f"('Expected to have finished reduction in the prior iteration')",
                "remove them or freeze them (requires_grad=False), or wrap with "
                "DistributedDataParallel(model, find_unused_parameters=True), as this check did",
                breaks=True,
            )
        )
    if processes < 2:
        out.append(
            _finding(
                "rank_dependent_untested",
                [],
                "one process ran every replica, so layers that depend on the rank could not show",
                "run the check with two or more processes",
                breaks=False,
            )
        )
    return out


def verdict(
    findings: list[dict[str, Any]], gradient_matches: bool, rel_l2: float, tolerance: float
) -> dict[str, Any]:
    breaking = [f for f in findings if f["breaks_equivalence"]]
    if not gradient_matches and not breaking:
        breaking.append(
            _finding(
                "unexplained",
                [],
                f"the DDP gradient is {rel_l2:.3g} (relative) from the single-process one, above the "
                f"tolerance {tolerance:.3g}, and none of the known causes showed",
                "look for per-batch normalisation in the loss (a mean over tokens rather than samples), "
                "in-place changes to the inputs, or state kept between forward passes",
                breaks=True,
            )
        )
        findings = [*findings, breaking[-1]]
    equivalent = gradient_matches and not breaking
    if equivalent:
        summary = "DDP-equivalent at this split: the DDP step's gradient equals the single-process gradient"
    else:
        summary = "not DDP-equivalent at this split: " + "; ".join(
            f["cause"].replace("_", " ") for f in breaking
        )
    return {"equivalent": equivalent, "summary": summary, "findings": findings}
