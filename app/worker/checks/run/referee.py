"""Rank 0's side of a run (a check of several optimizer steps): the reference run, and each
run-level control's run, trained in one process in lockstep with the plan's distributed run
and compared with it after every optimizer step. One referee serves the DDP and token runs
(check.py) and the mesh runs (mesh.py).

Tolerance per step, on the parameters' relative L2 distance and the loss's relative
difference: float64 1e-12. A DDP step differs from the single-process step by round-off
(about 1e-16 relative, from summing in another order), and a run carries each step's
difference into the next: measured on 4 warm ranks, 5e-15 after 1,000 steps of SGD with
momentum, 1e-15 of Adam with clipping, while every run-level mistake measured moves the
parameters by 1e-3 or more within a few steps. float32: 1e-5, where 20 steps end about 6e-8
apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from app.contract.check_result import ControlOutcome, SkippedControl
from app.contract.kinds.run import ControlStep, EpochEnd, RunOutcome, TrajectoryStep, step_matches
from app.core.records.plan import Plan
from app.worker.checks.result_parts import DETECTION_FACTOR
from app.worker.checks.run.controls import CLIP_BEFORE_ALL_REDUCE, RunControl, clip_never_bites, run_controls
from app.worker.training.gradients import compare
from app.worker.training.reference_run import ReferenceStep, ReferenceTrainer, RunVariant
from app.worker.training.token_model import TokenWorkload
from app.worker.training.workload import SyntheticWorkload, Workload

RUN_TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


class _Batches:
    """Every trainer of a step reads the same samples: build each micro-batch once a step."""

    def __init__(self, workload: Workload, dtype: torch.dtype, device: torch.device) -> None:
        self.workload, self.dtype, self.device = workload, dtype, device
        self.cache: dict[tuple[int, ...], tuple[Any, Any]] = {}

    def __call__(self, indices: Sequence[int]) -> tuple[Any, Any]:
        key = tuple(indices)
        if key not in self.cache:
            self.cache[key] = self.workload.batch(indices, self.dtype, self.device)
        return self.cache[key]


class _Followed:
    """A single-process run (the reference, or a control's) and what it recorded."""

    def __init__(self, trainer: ReferenceTrainer, steps: int) -> None:
        self.trainer = trainer
        self.steps: Iterator[ReferenceStep] = trainer.steps(steps)
        self.taken: list[ReferenceStep] = []

    def advance(self) -> torch.Tensor:
        self.taken.append(next(self.steps))
        return self.trainer.flat_params()


class Referee:
    def __init__(
        self,
        plan: Plan,
        steps: int,
        workload: Workload,
        *,
        dtype_name: str,
        device: torch.device,
        valid_tokens: Callable[[list[int]], int] | None = None,
    ) -> None:
        started = time.perf_counter()
        dtype = getattr(torch, dtype_name)
        self.plan, self.steps, self.tolerance = plan, steps, RUN_TOLERANCE[dtype_name]
        by_tokens = valid_tokens is not None
        reduction = "sum" if by_tokens else plan.loss_reduction
        self.batches = _Batches(workload, dtype, device)

        def micro_loss(net: torch.nn.Module, indices: list[int]) -> torch.Tensor:
            return workload.loss(net, *self.batches(indices), reduction)

        def sample_sum(net: torch.nn.Module, indices: list[int]) -> torch.Tensor:
            return workload.loss(net, *self.batches(indices), "sum")

        # The built-in models' losses are sums over samples (tokens): a step is one batch.
        separable = isinstance(workload, SyntheticWorkload) or (
            isinstance(workload, TokenWorkload) and workload.base is None and by_tokens
        )
        start = workload.single_process_module(dtype, device)

        def trainer(variant: RunVariant | None = None) -> _Followed:
            return _Followed(
                ReferenceTrainer(
                    plan,
                    start,
                    micro_loss,
                    variant=variant,
                    valid_tokens=valid_tokens,
                    sample_sum=sample_sum if separable else None,
                ),
                steps,
            )

        self.reference = trainer()
        applicable, self.skipped = run_controls(plan, steps)
        self.controls: list[tuple[RunControl, _Followed]] = [(c, trainer(v)) for c, v in applicable]
        self.params_off: list[tuple[float, float]] = []  # (max abs, relative L2) after each step
        self.control_off: dict[str, list[tuple[float, float]]] = {c.name: [] for c, _ in self.controls}
        self.seconds = time.perf_counter() - started

    def step(self, params: torch.Tensor) -> None:
        """After the run's next step, with its parameters (flat, in the module's order)."""
        started = time.perf_counter()
        reference = self.reference.advance()
        self.params_off.append(compare(params.to(reference.device, reference.dtype), reference))
        for control, followed in self.controls:
            self.control_off[control.name].append(compare(followed.advance(), reference))
        self.batches.cache.clear()
        self.seconds += time.perf_counter() - started

    def outcome(
        self,
        losses: Sequence[float],
        lrs: Sequence[float],
        epochs: Sequence[int],
        valid: Sequence[int | None],
    ) -> tuple[RunOutcome, tuple[ControlOutcome, ...], tuple[SkippedControl, ...]]:
        """The run (its losses, lrs, epochs and valid tokens per step) against the reference,
        and the run-level controls: each detected when its parameters end far from the
        reference's, or skipped when it changed nothing."""
        ref = self.reference.taken
        trajectory = tuple(
            TrajectoryStep(
                k,
                epochs[k],
                lrs[k],
                losses[k],
                ref[k].loss,
                self.params_off[k][1],
                valid[k],
                step_matches(self.params_off[k][1], losses[k], ref[k].loss, self.tolerance),
            )
            for k in range(self.steps)
        )
        outcomes: list[ControlOutcome] = []
        skipped = list(self.skipped)
        ran: dict[str, tuple[ControlStep, ...]] = {}
        for control, followed in self.controls:
            off = self.control_off[control.name]
            clips = any(s.clipped for s in followed.taken) or any(s.clipped for s in ref)
            if control is CLIP_BEFORE_ALL_REDUCE and not clips:
                skipped.append(clip_never_bites(self.plan))
                continue
            max_abs, rel = off[-1]
            detected = rel > DETECTION_FACTOR * self.tolerance
            outcomes.append(ControlOutcome(control.name, control.description, rel, max_abs, detected))
            ran[control.name] = tuple(
                ControlStep(s.step, s.lr, s.loss, o[1]) for s, o in zip(followed.taken, off, strict=True)
            )
        run = RunOutcome(trajectory, self.tolerance, self.epoch_end(max(epochs) + 1), ran)
        return run, tuple(outcomes), tuple(skipped)

    def epoch_end(self, epochs_run: int) -> EpochEnd:
        sampler = self.plan.sampler
        assert sampler is not None
        short = None
        if self.plan.split == "even" and self.plan.micro_batch_size:
            shard = sampler.total_size // self.plan.data_parallel_size
            short = shard % self.plan.micro_batch_size or None
            # Only a step that reads it weighs it: a dropped leftover is never run.
            if sampler.leftover_micro_steps:
                short = None
        return EpochEnd(
            optimizer_steps_per_epoch=sampler.optimizer_steps_per_epoch,
            epochs_run=epochs_run,
            leftover=sampler.leftover,
            leftover_micro_steps=sampler.leftover_micro_steps,
            short_micro_batch_samples=short,
        )
