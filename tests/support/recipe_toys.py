"""The toy that the real-tool runs of the exports train (tests/core/test_recipe_runs.py), shared
by the torchrun processes (support/recipe_runner.py) and the single-process reference, so both
train the same float64 model on the same samples.

`Recorder` notes each micro-batch's loss, weighted as the plan weighs it (its replica's
loss_scale / data_parallel_size); a global optimizer step hook turns those into the step's
loss over the global batch (one all-reduce) and notes the lr the step ran at.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES = 4
DTYPE = torch.float64


def build_model() -> nn.Module:
    """The same initial weights in every process: a seeded MLP in float64."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1)).to(DTYPE)


class PairDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i is (x_i, y_i): a fixed, seeded regression problem."""

    def __init__(self, num_samples: int) -> None:
        generator = torch.Generator().manual_seed(99)
        self.x = torch.randn(num_samples, FEATURES, generator=generator, dtype=DTYPE)
        weights = torch.randn(FEATURES, 1, generator=generator, dtype=DTYPE)
        self.y = torch.sin(self.x @ weights) + 0.1 * torch.randn(
            num_samples, 1, generator=generator, dtype=DTYPE
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class DictDataset(Dataset[dict[str, torch.Tensor]]):
    """The same samples as the HF Trainer takes them: a dict with the model's arguments."""

    def __init__(self, num_samples: int) -> None:
        self.pairs = PairDataset(num_samples)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.pairs[i]
        return {"x": x, "labels": y}


class Recorder:
    """Each micro-batch's weighted loss since the last optimizer step."""

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.pending = 0.0

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = nn.functional.mse_loss(output, target)
        self.pending += value.item() * self.weight
        return value


class HfModel(nn.Module):
    """The toy as the HF Trainer calls it: forward(**batch) returns {"loss": ...}."""

    def __init__(self, net: nn.Module, recorder: Recorder | None = None) -> None:
        super().__init__()
        self.net = net
        self.recorder = recorder

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        output = self.net(x)
        loss = self.recorder.loss(output, labels) if self.recorder else nn.functional.mse_loss(output, labels)
        return {"loss": loss}


def pair_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The reference's loss of a collated (x, y) micro-batch."""
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def dict_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The reference's loss of a collated {"x", "labels"} micro-batch."""
    return nn.functional.mse_loss(model(batch["x"]), batch["labels"])
