"""bench_lr_truth.py's workload: scikit-learn's bundled digits (1,797 8x8 images, 10 classes)
as a check-model factory with its referee, a fixed 400-image held-out set and accuracy."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

HELD_OUT = 400


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=1) == targets).double().mean()


def split() -> tuple[TensorDataset, TensorDataset]:
    """(training, held-out): one fixed split, whatever the seed."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    held, train = order[:HELD_OUT], order[HELD_OUT:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[held], y[held])


def digits(seed: int = 0) -> tuple[nn.Module, TensorDataset, nn.Module, dict[str, Any]]:
    """A 64-64-10 MLP on the digits, judged by its held-out accuracy."""
    train, held = split()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    referee = {"held_out": held, "metric": accuracy, "name": "accuracy", "higher_is_better": True}
    return model, train, nn.CrossEntropyLoss(), referee
