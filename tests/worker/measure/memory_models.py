"""A small MLP, its data and loss: what the micro-batch finder's tests probe."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class Pairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int = 64, inputs: int = 32, outputs: int = 10) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, inputs, generator=generator)
        self.y = torch.randn(size, outputs, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def mlp(*extra: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), *extra, nn.Linear(256, 10))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
