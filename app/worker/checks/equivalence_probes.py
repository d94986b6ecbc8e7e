"""Running the model to see what its module tree cannot show: whether its forward pass or
its gradient draws random numbers (and in which module's forward they are drawn), whether
it computes a different function on each rank, and which parameters get no gradient.

Every probe runs under `torch.random.fork_rng`, so the check's own random state is left
as it was, and seeds the same fixed value on every rank: only the generators of the devices
the model runs on (`torch.manual_seed` seeds every device type there is, formatting a stack
for the lazily seeded ones: about a millisecond a call, against microseconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

PROBE_SEED = 20_181_214  # any fixed value: every rank draws the same random numbers

# Two passes that draw the same random numbers agree to rounding, which in float64 is
# ~1e-16 relative; anything above these is randomness (a ConvNeXt's drop path behind a
# layer scale of 1e-6 moves its output by ~1e-7). float32 leaves room for reordered sums.
DIFFERENT = {"float64": 1e-12, "float32": 1e-6}


def different(dtype: str) -> float:
    return DIFFERENT.get(dtype, DIFFERENT["float32"])


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


def _rng_devices(device: torch.device) -> list[torch.device]:
    return [device] if device.type == "cuda" else []


def seed_devices(seed: int, device: torch.device) -> None:
    """The CPU generator and, on a GPU, that GPU's: the generators a model on `device` draws from."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


def _flat_output(forward: Callable[[], Any], seed: int, device: torch.device) -> torch.Tensor:
    with torch.random.fork_rng(devices=_rng_devices(device)), torch.no_grad():
        seed_devices(seed, device)
        parts = [t.detach().reshape(-1).double() for t in _tensors(forward()) if t.is_floating_point()]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=device)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(b.abs().max()) if b.numel() else 0.0, 1e-30)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0


def stochastic_forward(forward: Callable[[], Any], device: torch.device) -> float:
    """How far two forward passes of the same input under different random states differ."""
    return _relative(_flat_output(forward, PROBE_SEED, device), _flat_output(forward, PROBE_SEED + 1, device))


def _flat_gradient(module: nn.Module, backward_once: Callable[[nn.Module], None], seed: int) -> torch.Tensor:
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    module.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=_rng_devices(device)):
        seed_devices(seed, device)
        backward_once(module)
    flat = torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).double()
            for p in module.parameters()
            if p.requires_grad
        ]
        or [torch.zeros(0, dtype=torch.float64)]
    )
    module.zero_grad(set_to_none=True)
    return flat


def stochastic_gradient(module: nn.Module, backward_once: Callable[[nn.Module], None]) -> float:
    """How far the gradients of two passes under different random states differ: randomness
    that barely moves the output (stochastic depth behind a tiny layer scale) moves the
    gradients of the parameters it gates by their whole size."""
    return _relative(
        _flat_gradient(module, backward_once, PROBE_SEED),
        _flat_gradient(module, backward_once, PROBE_SEED + 1),
    )


def _rng_state(device: torch.device) -> list[torch.Tensor]:
    state = [torch.get_rng_state()]
    if device.type == "cuda":
        state.append(torch.cuda.get_rng_state(device))
    return state


def random_draws(forward: Callable[[], Any], module: nn.Module, device: torch.device) -> list[str]:
    """The modules whose own forward code drew random numbers (functional dropout in an
    attention module, a drop path, noise), by watching the generators' state at every
    module's entry and exit: a change is charged to the module running at that moment."""
    names = {m: n or "(root)" for n, m in module.named_modules()}
    stack: list[str] = []
    drew: list[str] = []
    last = [_rng_state(device)]

    def charge() -> None:
        now = _rng_state(device)
        moved = any(not torch.equal(a, b) for a, b in zip(now, last[0], strict=True))
        if stack and moved and stack[-1] not in drew:
            drew.append(stack[-1])
        last[0] = now

    def enter(m: nn.Module, args: Any) -> None:
        charge()
        stack.append(names[m])

    def leave(m: nn.Module, args: Any, output: Any) -> None:
        charge()
        if stack:
            stack.pop()

    handles = [m.register_forward_pre_hook(enter) for m in names]
    handles += [m.register_forward_hook(leave) for m in names]
    try:
        with torch.random.fork_rng(devices=_rng_devices(device)), torch.no_grad():
            seed_devices(PROBE_SEED, device)
            last[0] = _rng_state(device)
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return drew


def rank_difference(forward: Callable[[], Any], device: torch.device) -> float:
    """The largest difference from rank 0's output of the same input and random state, over
    all ranks (a collective: every rank calls it and gets the same answer)."""
    mine = _flat_output(forward, PROBE_SEED, device)
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
