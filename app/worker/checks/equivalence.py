"""Why a model is or is not DDP-equivalent at a planned split: the DDP step's gradient equals
the single-process gradient of the global batch only when each sample's gradient depends on
nothing but that sample and the weights.

Known causes are looked for, each both in the module tree and by running the model
(`checks.equivalence_probes`): BatchNorm (statistics over each micro-batch, not the
global batch), dropout, stochastic depth or any other randomness in the forward pass, layers
that behave differently on different ranks, and parameters that the forward pass does not
use (the gradient is right, but DDP's default then fails at the next step). Modules are
judged in the modes the factory left them in: an eval-mode batch norm or dropout is no cause.
"""

from __future__ import annotations

import re

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from app.contract.equivalence import Equivalence, Finding
from app.contract.spec import CheckSpec
from app.worker.checks.equivalence_probes import different

# torchvision's StochasticDepth, timm's DropPath and DropBlock, and the many copies of them.
_STOCHASTIC_DEPTH = re.compile(r"stochastic_?depth|drop_?path|drop_?block", re.IGNORECASE)
_RATE_ATTRIBUTES = ("p", "drop_prob", "drop_rate", "drop_path_rate", "prob")


def _finding(
    cause: str,
    modules: list[str],
    detail: str,
    fix: str,
    breaks: bool,
    *,
    fails_with_ddp_defaults: bool = False,
) -> Finding:
    return Finding(cause, tuple(modules[:20]), detail, fix, breaks, fails_with_ddp_defaults)


def _drop_rate(module: nn.Module) -> float:
    for attribute in _RATE_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return 1.0  # a rate under another name: count the module


def stochastic_depth_modules(module: nn.Module) -> list[str]:
    return [
        n or "(root)"
        for n, m in module.named_modules()
        if _STOCHASTIC_DEPTH.search(type(m).__name__) and m.training and _drop_rate(m) > 0
    ]


def static_findings(
    module: nn.Module, spec: CheckSpec, *, processes: int = 0, own_loss: bool = False
) -> list[Finding]:
    """What the module tree shows, judged at the plan's split (`processes`: how many run the
    replicas; `own_loss`: the loss is the model's own `outputs.loss`)."""
    out = _batch_norm_findings(module, spec, processes)
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
    depth = stochastic_depth_modules(module)
    if depth:
        out.append(
            _finding(
                "stochastic_depth",
                depth,
                f"{len(depth)} stochastic-depth (drop path) module(s) skip a random choice of samples' "
                f"residual branches per forward pass: each replica (and the single-process step) "
                f"skips different ones",
                "run the check with the drop-path rate at 0 (a factory argument, or eval() for those "
                "modules) to prove the split; in training, stochastic depth is expected noise, not a "
                "batching error",
                breaks=True,
            )
        )
    if own_loss:
        out.append(
            _finding(
                "loss_over_tokens",
                [],
                "the loss is the model's own outputs.loss; Transformers' language-model losses "
                "average over the micro-batch's labelled tokens, not its samples: the plan's "
                "per-sample loss scales are exact only when every sample has as many labelled "
                "tokens (the gradient comparison shows whether they had)",
                "give every sample the same number of labelled tokens (no -100 padding labels), or "
                "return a per-sample mean loss_fn; token-level normalisation comes with token plans",
                breaks=False,
            )
        )
    return out


def _batch_norm_findings(module: nn.Module, spec: CheckSpec, processes: int) -> list[Finding]:
    out = []
    micro = min(spec.micro_batch_sizes())
    dp, g, G = spec.data_parallel_size, spec.gradient_accumulation_steps, spec.global_batch_size
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
                f"together, so every sample's gradient depends on which others share its micro-batch. "
                f"Per-replica batch norm is DDP's default and the common, accepted recipe for training "
                f"CNNs; what it costs is this equivalence: the step depends on the split (and statistics "
                f"of small micro-batches are noisy)",
                "nothing, if per-replica statistics are acceptable, as in most CNN training; to make the "
                "step independent of the split: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) "
                "(NCCL on GPUs) with no gradient accumulation, GroupNorm/LayerNorm (each sample "
                "normalised on its own), or the batch norms in eval mode (frozen statistics, as in "
                "fine-tuning)",
                breaks=micro < G,
            )
        )
    if synced:
        per_process = -(-dp // processes) if processes else 1
        if g > 1 or per_process > 1:
            detail = "SyncBatchNorm shares statistics across the processes of one forward pass, but " + (
                f"each of the {g} accumulation steps normalises only {G // g} of the {G} samples"
                if g > 1
                else f"each process runs {per_process} replicas one after another, so no forward pass "
                f"sees all {G} samples"
            )
            fix = (
                "plan without gradient accumulation and with one process per replica (more GPUs or a "
                "larger micro-batch), or use GroupNorm/LayerNorm"
            )
        else:
            detail = (
                f"SyncBatchNorm normalises the whole global batch of {G} across the {dp} replicas: the "
                f"check compared the DDP step with one process that runs these layers as BatchNorm "
                f"over all {G} samples"
            )
            fix = "nothing: at this split SyncBatchNorm computes the single-process step"
        out.append(_finding("batch_norm", synced, detail, fix, breaks=g > 1 or per_process > 1))
    return out


def _covered(name: str, known: list[Finding]) -> bool:
    """Whether `name` is a module a finding already names, or inside one."""
    return any(name == k or name.startswith(k + ".") for f in known for k in f.modules)


# Over 60 lines: one finding per way the DDP gradient can differ, each a sentence with its own
# measured numbers.
def empirical_findings(
    *,
    stochastic: float,
    rank: float,
    processes: int,
    unused: list[str],
    known: list[Finding],
    dtype: str = "float64",
    draws: list[str] | None = None,
) -> list[Finding]:
    """What running the model showed: `stochastic`, the larger relative difference of the
    outputs or gradients of two passes under different random states; `draws`, the modules
    whose own forward drew random numbers; `rank`, the difference between ranks."""
    out = []
    threshold = different(dtype)
    causes = {f.cause for f in known}
    unexplained_draws = [n for n in draws or [] if not _covered(n, known)]
    if stochastic > threshold and (not causes & {"dropout", "stochastic_depth"} or unexplained_draws):
        out.append(
            _finding(
                "stochastic_forward",
                unexplained_draws,
                f"the same input under another random state gives outputs or gradients {stochastic:.3g} "
                f"apart (relative, above the {threshold:.0e} that rounding allows in {dtype}): the forward "
                f"pass draws random numbers (functional dropout, drop path, noise, sampling)"
                + (f", in the forward of {', '.join(unexplained_draws[:5])}" if unexplained_draws else ""),
                "turn the randomness off for the check: eval() the modules named here or set their rate "
                "to 0 in the factory (e.g. attention_dropout=0), or seed it per sample",
                breaks=True,
            )
        )
    if rank > threshold:
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
                f"{len(unused)} trainable parameter(s) get no gradient in the forward pass. The gradient "
                f"itself is right (this check wrapped the model with find_unused_parameters=True), but "
                f"DDP's default (find_unused_parameters=False) waits for them and fails at the next step "
                f"('Expected to have finished reduction in the prior iteration')",
                "remove them or freeze them (requires_grad=False), or wrap with "
                "DistributedDataParallel(model, find_unused_parameters=True), as this check did",
                breaks=False,
                fails_with_ddp_defaults=True,
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


def verdict(findings: list[Finding], gradient_matches: bool, rel_l2: float, tolerance: float) -> Equivalence:
    breaking = [f for f in findings if f.breaks_equivalence]
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
    fails = [f for f in findings if f.fails_with_ddp_defaults]
    if equivalent:
        summary = "DDP-equivalent at this split: the DDP step's gradient equals the single-process gradient"
    else:
        summary = "not DDP-equivalent at this split: " + "; ".join(
            f.cause.replace("_", " ") for f in breaking
        )
    if fails:
        summary += "; but with DDP's defaults training fails at the next step: " + "; ".join(
            f.cause.replace("_", " ") for f in fails
        )
    return Equivalence(equivalent, bool(fails), summary, tuple(findings))
