"""The equivalence probes of a DDP check, and their answers kept on a warm rank for the next
check of the same model.

The probes run fresh copies of the workload's model under fixed seeds on fixed samples, so
what they find is a function of the key: the workload object (a factory's build, which no
check changes: each trains a copy), the dtype, the device, the probe's sample indices, this
rank and the number of processes (a model may compute by rank). An entry is valid for any
later check with an equal key; it goes with its workload (the rank server keeps the last 4
built, and a rank process that is replaced starts empty) or when a workload holds more than
MAX_ENTRIES keys (all of its entries are dropped).

The rank probe is a collective, so every rank must take the same path: a check uses the
kept answers only when every rank holds its own entry, which one all-reduce decides; if any
rank lacks it, every rank probes again and keeps what it found.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from app.worker.checks import equivalence_probes as probes
from app.worker.training.synthetic_model import backward
from app.worker.training.workload import Workload

MAX_ENTRIES = 8

Key = tuple[str, str, tuple[int, ...], int, int]  # dtype, device, probe samples, rank, processes


@dataclass(frozen=True, slots=True)
class LocalAnswers:
    """What the probes found before DDP wraps the module (DDP needs `unused`)."""

    unused: tuple[str, ...]  # trainable parameters one backward leaves without a gradient
    gradient_spread: float  # two backward passes under different random states, apart


@dataclass(frozen=True, slots=True)
class ProbeAnswers:
    local: LocalAnswers
    stochastic: float  # the larger of the output's and the gradient's spread
    rank: float  # the largest difference from rank 0's output (the same on every rank)
    draws: tuple[str, ...]  # modules whose own forward drew random numbers


_KEPT: weakref.WeakKeyDictionary[Workload, dict[Key, ProbeAnswers]] = weakref.WeakKeyDictionary()


def key_of(dtype: torch.dtype, device: torch.device, probe: Sequence[int], rank: int, world: int) -> Key:
    return (str(dtype), str(device), tuple(probe), rank, world)


def kept(workload: Workload, key: Key, device: torch.device) -> ProbeAnswers | None:
    """This rank's kept answers when every rank holds its own (a collective), else None."""
    answers = _KEPT.get(workload, {}).get(key)
    missing = torch.tensor([0 if answers is not None else 1], dtype=torch.int64, device=device)
    dist.all_reduce(missing, op=dist.ReduceOp.MAX)
    return answers if int(missing) == 0 else None


def keep(workload: Workload, key: Key, answers: ProbeAnswers) -> None:
    entries = _KEPT.setdefault(workload, {})
    if len(entries) >= MAX_ENTRIES:
        entries.clear()
    entries[key] = answers


def local_probes(module: torch.nn.Module, backward_once: Callable[[torch.nn.Module], None]) -> LocalAnswers:
    unused = probes.unused_parameters(module, backward_once)
    return LocalAnswers(tuple(unused), probes.stochastic_gradient(module, backward_once))


def probe_backward(
    workload: Workload, probe: Sequence[int], dtype: torch.dtype, device: torch.device
) -> Callable[[torch.nn.Module], None]:
    """One backward pass of the mean loss over the probe's samples."""

    def backward_once(m: torch.nn.Module) -> None:
        backward(workload.loss(m, *workload.batch(probe, dtype, device), "mean"))

    return backward_once


def probe_forward(
    module: torch.nn.Module,
    workload: Workload,
    probe: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> Callable[[], Any]:
    x, _ = workload.batch(probe, dtype, device)
    return lambda: workload.forward(module, x)


def wrapped_probes(
    wrapped: torch.nn.Module,
    workload: Workload,
    probe: Sequence[int],
    local: LocalAnswers,
    *,
    dtype: torch.dtype,
    dtype_name: str,
    device: torch.device,
) -> ProbeAnswers:
    """The probes of the module DDP wraps (after DDP made every rank's weights rank 0's): the
    output's spread, which modules drew random numbers, and the difference between ranks."""
    forward = probe_forward(wrapped, workload, probe, dtype, device)
    stochastic = max(probes.stochastic_forward(forward, device), local.gradient_spread)
    draws: list[str] = []
    if stochastic > probes.different(dtype_name):
        alone = workload.single_process_module(dtype, device)  # no collectives in its forward
        draws = probes.random_draws(probe_forward(alone, workload, probe, dtype, device), alone, device)
    return ProbeAnswers(local, stochastic, probes.rank_difference(forward, device), tuple(draws))
