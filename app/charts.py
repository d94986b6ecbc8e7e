"""Charts of a training schedule, of a check's run and of its measured throughput, drawn with
matplotlib's Agg backend (no display needed).

Kept out of app.core: matplotlib is a heavy, optional dependency, and the core is pure.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import matplotlib

matplotlib.use("Agg")  # a server has no display

# Figure, not pyplot: no global figure registry, so charts can be drawn in worker threads.
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from app.core.records.schedule import Schedule

MEDIA_TYPES = {"png": "image/png", "svg": "image/svg+xml"}


def lr_title(schedule: Schedule) -> str:
    """What the lr panel shows, in words: a warmup that starts at the peak is no warmup."""
    after = {
        "constant": "constant",
        "step": "step decay at the milestones",
    }.get(schedule.decay, f"{schedule.decay} decay to {schedule.min_lr:g}")
    if not schedule.warmup_steps:
        return f"no warmup, {after}"
    if schedule.warmup_start_lr == schedule.peak_lr:
        return f"{after} (the warmup starts at the peak lr: it changes nothing)"
    return f"linear warmup from {schedule.warmup_start_lr:g}, then {after}"


def schedule_chart(schedule: Schedule, fmt: str, title: str) -> bytes:
    """The global batch (and accumulation) and the learning rate against the optimizer step."""
    steps = [p.step for p in schedule.points]
    rows = 2 if schedule.peak_lr is not None else 1
    # The answer's warnings under the plots, where whoever reads the chart sees them.
    notes = [line for w in schedule.warnings for line in textwrap.wrap(f"warning: {w}", 170)]
    height = 3.2 * rows + 0.6 + 0.14 * len(notes)
    fig = Figure(figsize=(9, height))
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.step(steps, [p.global_batch_size for p in schedule.points], where="post", color="tab:blue")
    ax.set_ylabel("global batch (samples)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.step(
        steps,
        [p.gradient_accumulation_steps for p in schedule.points],
        where="post",
        color="tab:orange",
        linestyle="--",
    )
    twin.set_ylabel("accumulation steps", color="tab:orange")
    # Headroom so the dashed line does not sit exactly on the solid one.
    twin.set_ylim(0, max(p.gradient_accumulation_steps for p in schedule.points) * 1.3)
    twin.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Global batch size (solid) and gradient accumulation (dashed)")
    if rows == 2:
        lr_ax = axes[1][0]
        lr_ax.plot(steps, [p.lr for p in schedule.points], color="tab:green")
        if schedule.warmup_steps:
            lr_ax.axvline(schedule.warmup_steps, color="grey", linestyle=":", label="end of warmup")
            lr_ax.legend(loc="upper right")
        lr_ax.set_ylabel("learning rate")
        lr_ax.set_ylim(bottom=0)
        lr_ax.grid(alpha=0.3)
        lr_ax.set_title(f"Learning rate: {lr_title(schedule)}")
    axes[-1][0].set_xlabel("optimizer step")
    fig.suptitle(title)
    footer = (0.14 * len(notes) + 0.1) / height if notes else 0.0
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7.5, va="bottom", color="tab:red")
    fig.tight_layout(rect=(0, footer, 1, 1))
    return _image(fig, fmt)


def trajectory_chart(result: Mapping[str, Any], fmt: str, title: str) -> bytes:
    """A check's run (its result's JSON): the loss at every optimizer step of the plan's run, the
    reference run's and each run-level control's, and the lr each stepped with."""
    trajectory = result["trajectory"]
    controls: dict[str, list[dict[str, Any]]] = result.get("control_trajectories") or {}
    steps = [s["step"] for s in trajectory]
    fig = Figure(figsize=(9, 7))
    loss_ax, lr_ax = fig.subplots(2, 1, sharex=True)
    for name, run in controls.items():
        loss_ax.plot([s["step"] for s in run], [s["loss"] for s in run], linewidth=1, alpha=0.8, label=name)
        lr_ax.plot([s["step"] for s in run], [s["lr"] for s in run], linewidth=1, alpha=0.8, label=name)
    loss_ax.plot(
        steps, [s["reference_loss"] for s in trajectory], color="black", linewidth=3, label="reference"
    )
    loss_ax.plot(
        steps, [s["loss"] for s in trajectory], color="tab:red", linestyle="--", label="the plan's run"
    )
    lr_ax.plot(steps, [s["lr"] for s in trajectory], color="tab:red", linestyle="--", label="the plan's run")
    for epoch_start in _epoch_starts(trajectory):
        loss_ax.axvline(epoch_start, color="grey", linestyle=":")
        lr_ax.axvline(epoch_start, color="grey", linestyle=":")
    resume = result.get("resume")
    if resume:  # a resume check: where the run stopped on the plan's replicas and went on on others
        label = (
            f"resumed at step {resume['at_step']}: {resume['data_parallel_size_before']} -> "
            f"{resume['data_parallel_size_after']} replicas"
        )
        loss_ax.axvline(resume["at_step"], color="tab:blue", linestyle="-.", linewidth=2, label=label)
        lr_ax.axvline(resume["at_step"], color="tab:blue", linestyle="-.", linewidth=2)
    verdict = "matches" if result.get("trajectory_matches") else "does NOT match"
    loss_ax.set_title(
        f"Loss per step: the plan's run {verdict} the reference (parameters "
        f"{result['final_params_rel_l2']:.2g} apart at the end)"
    )
    loss_ax.set_ylabel("loss over the global batch")
    loss_ax.legend(fontsize="small", loc="upper right")
    loss_ax.grid(alpha=0.3)
    marks = "dotted lines: epoch boundaries" + ("; dash-dot: the resume" if resume else "")
    lr_ax.set_title(f"Learning rate per optimizer step ({marks})")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("optimizer step")
    lr_ax.set_ylim(bottom=0)
    lr_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lr_ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return _image(fig, fmt)


def _epoch_starts(trajectory: list[dict[str, Any]]) -> list[int]:
    return [s["step"] for previous, s in pairwise(trajectory) if s["epoch"] != previous["epoch"]]


def throughput_chart(throughput: Mapping[str, Any], fmt: str, title: str) -> bytes:
    """A check's `throughput`: samples/s against the micro-batch (log 2 axis), each point's
    spread as an error bar, the fastest micro-batch and the knee marked."""
    points = throughput["points"]
    sizes = [p["micro_batch_size"] for p in points]
    rates = [p["samples_per_s"] for p in points]
    errors = [p["samples_per_s"] * p["spread"] / 2 for p in points]
    fig = Figure(figsize=(9, 5))
    ax = fig.subplots()
    ax.errorbar(sizes, rates, yerr=errors, marker="o", color="tab:blue", capsize=3, label="samples/s")
    by_size = dict(zip(sizes, rates, strict=True))
    fastest, knee = throughput["fastest_micro_batch_size"], throughput["knee_micro_batch_size"]
    ax.axhline(by_size[fastest] * (1 - throughput["margin"]), color="grey", linestyle=":", linewidth=1)
    ax.plot([fastest], [by_size[fastest]], "*", color="tab:red", markersize=16, label=f"fastest: {fastest}")
    ax.plot(
        [knee],
        [by_size[knee]],
        "D",
        color="tab:green",
        markersize=9,
        label=f"knee: {knee} (within {throughput['margin']:.0%} of the fastest)",
    )
    if len(set(sizes)) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("micro-batch size")
    ax.set_ylabel("samples per second (one replica)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    step = (
        "forward, backward and optimizer step"
        if throughput["time_optimizer_step"]
        else "forward and backward"
    )
    ax.set_title(
        f"{step}; median of {throughput['repeats']} repeats, bars: {throughput['spread_is']}", fontsize=9
    )
    fig.suptitle(title)
    fig.tight_layout()
    return _image(fig, fmt)


def lr_scaling_chart(probe: Mapping[str, Any], fmt: str, title: str) -> bytes:
    """An lr-scaling probe (its result's `lr_scaling`): the held-out loss against the samples
    trained, the base run's and each rule's, with the verdict below."""
    fig = Figure(figsize=(9, 6))
    ax = fig.subplots()
    base = probe["base"]
    ax.plot(
        [p["samples"] for p in base["curve"]],
        [p["loss"] for p in base["curve"]],
        color="black",
        linewidth=3,
        label=f"base: {base['batch_size']:,} at lr {base['lr']:.4g}",
    )
    for run in probe["rules"]:
        points = [p for p in run["curve"] if p["loss"] is not None]
        verdict = run.get("outcome", "holds" if run["holds"] else "lags")
        if run["final_loss_ratio"] is None:
            verdict = "diverges"
        ax.plot(
            [p["samples"] for p in points],
            [p["loss"] for p in points],
            linestyle="--",
            marker="o",
            markersize=3,
            label=f"{run['rule']}: {probe['global_batch_size']:,} at lr {run['lr']:.4g} ({verdict})",
        )
    ax.set_xlabel("samples trained")
    ax.set_ylabel("loss on the held-out batch (first seed; log scale)")
    # A log axis: a rule that diverges or starts high would otherwise flatten the others' ends,
    # where the verdict is read.
    losses = [p["loss"] for run in (base, *probe["rules"]) for p in run["curve"] if p["loss"] is not None]
    if losses and min(losses) > 0:
        ax.set_yscale("log")
    ax.set_title(f"best rule: {probe['best_rule']}; regime: {probe['regime'].replace('_', ' ')}")
    ax.legend(fontsize="small", loc="upper right")
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.text(0.01, 0.01, "\n".join(textwrap.wrap(probe["verdict"], 130)), fontsize=7.5, va="bottom")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return _image(fig, fmt)


def _image(fig: Figure, fmt: str) -> bytes:
    """The figure as the answer's bytes, in `fmt` (png or svg)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=100)
    return buffer.getvalue()
