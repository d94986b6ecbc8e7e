"""The one model a check trains: small, deterministic, with no BatchNorm or dropout, so a
replica's gradient depends only on its samples and the weights."""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

INPUTS, HIDDEN, OUTPUTS = 8, 16, 4


def build_model(seed: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The same weights on every rank for the same seed, whatever the global RNG state."""
    model = nn.Sequential(nn.Linear(INPUTS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUTPUTS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            fan_in = parameter.shape[-1] if parameter.dim() > 1 else HIDDEN
            parameter.copy_(
                torch.randn(parameter.shape, generator=generator, dtype=torch.float64) / math.sqrt(fan_in)
            )
    return model.to(device=device, dtype=dtype)


def synthetic_batch(
    indices: torch.Tensor, seed: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of samples `indices`, a pure function of (seed, index).

    Computed in float64 and then cast, so that a sample is the same on every rank and in the
    reference, and distinct indices give distinct samples at any dataset size.
    """
    frequencies, phases = _waves(seed)
    t = indices.to(torch.float64).unsqueeze(1)
    values = torch.sin(t * frequencies + phases)
    x = values[:, :INPUTS].to(device=device, dtype=dtype)
    y = torch.cos(3 * values[:, INPUTS:]).to(device=device, dtype=dtype)
    return x, y


@functools.lru_cache(maxsize=64)
def _waves(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples' frequencies and phases for `seed`: made once per seed (a generator and two
    draws were 3 % of a mesh check's rank time, made for every micro-batch); never written."""
    generator = torch.Generator().manual_seed(seed + 1)
    frequencies = torch.rand(INPUTS + OUTPUTS, generator=generator, dtype=torch.float64) * 0.9 + 0.1
    phases = torch.rand(INPUTS + OUTPUTS, generator=generator, dtype=torch.float64) * 2 * math.pi
    return frequencies, phases


def half_squared_error(prediction: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Half the squared error per sample, then its mean or sum over the batch."""
    per_sample = 0.5 * ((prediction - y) ** 2).sum(dim=1)
    return per_sample.mean() if reduction == "mean" else per_sample.sum()


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    prediction: torch.Tensor = model(x)
    return half_squared_error(prediction, y, reduction)


def flat_gradient(model: nn.Module) -> torch.Tensor:
    return torch.cat(
        [
            p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
            for p in model.parameters()
        ]
    )


def backward(loss: torch.Tensor) -> None:
    # torch leaves Tensor.backward unannotated
    loss.backward()  # type: ignore[no-untyped-call]
