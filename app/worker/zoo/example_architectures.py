"""Small re-creations of real vision architectures, as check-model factories: a ResNet with
basic blocks and batch norm (in the variants the batch-norm finding names) and a ConvNeXt
with stochastic depth behind a layer scale. Random-init and tiny, for the tests and to copy
from; torchvision itself works the same way where it can be imported.

    BATCHPLAN_CHECK_MODELS="resnet=app.worker.example_architectures:resnet"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

CHANNELS, CLASSES, SIZE, SAMPLES = 8, 4, 8, 1024
Norm = Callable[[int], nn.Module]


def _images(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 3, SIZE, SIZE, generator=generator)
    return TensorDataset(x, (x.mean(dim=(2, 3)) @ torch.randn(3, CLASSES, generator=generator)).argmax(1))


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: conv-norm-relu-conv-norm plus the identity."""

    def __init__(self, channels: int, norm: Norm) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = norm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + x)


class ResNet(nn.Module):
    def __init__(self, norm: Norm) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, CHANNELS, 3, padding=1, bias=False), norm(CHANNELS), nn.ReLU())
        self.layer1 = nn.Sequential(BasicBlock(CHANNELS, norm), BasicBlock(CHANNELS, norm))
        self.fc = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.layer1(self.stem(x)).mean(dim=(2, 3)))
        return out


def resnet(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """A two-block ResNet with BatchNorm in training mode: per-replica statistics."""
    return ResNet(nn.BatchNorm2d), _images(seed), nn.CrossEntropyLoss()


def resnet_frozen_bn(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The ResNet with its batch norms in eval mode (frozen statistics, as in fine-tuning)."""
    model = ResNet(nn.BatchNorm2d)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.eval()
    return model, _images(seed), nn.CrossEntropyLoss()


def resnet_group_norm(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The ResNet with GroupNorm, which normalises each sample on its own."""
    return ResNet(lambda c: nn.GroupNorm(2, c)), _images(seed), nn.CrossEntropyLoss()


def resnet_sync_bn(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The ResNet with SyncBatchNorm: statistics over every replica (GPUs only)."""
    model: nn.Module = nn.SyncBatchNorm.convert_sync_batchnorm(ResNet(nn.BatchNorm2d))  # type: ignore[no-untyped-call]
    return model, _images(seed), nn.CrossEntropyLoss()


class DropPath(nn.Module):
    """Stochastic depth per sample, as timm's DropPath: a residual branch is dropped for a
    random choice of samples and the rest scaled by 1/(1 - p)."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        dropped: torch.Tensor = x * mask / keep
        return dropped


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: depthwise 7x7, LayerNorm, an inverted MLP, a layer scale starting at
    1e-6, and drop path on the branch."""

    def __init__(self, dim: int, drop_path: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        branch = self.gamma * self.pwconv2(nn.functional.gelu(self.pwconv1(branch)))
        out: torch.Tensor = x + self.drop_path(branch.permute(0, 3, 1, 2))
        return out


class ConvNeXt(nn.Module):
    def __init__(self, drop_path: float) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 2, stride=2)
        self.stages = nn.Sequential(ConvNeXtBlock(CHANNELS, drop_path), ConvNeXtBlock(CHANNELS, drop_path))
        self.head = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))
        return out


def convnext(seed: int = 0, drop_path: float = 0.2) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """A two-block ConvNeXt with drop path 0.2 behind a 1e-6 layer scale."""
    return ConvNeXt(drop_path), _images(seed), nn.CrossEntropyLoss()


class FixedBatch(nn.Module):
    """A model with a bug that two samples do not show: it reshapes to a batch of 2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * SIZE * SIZE, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(2, 3 * SIZE * SIZE)  # the bug: the batch size written in
        out: torch.Tensor = self.fc(flat)
        return out


def fixed_batch(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """A classifier that only runs on batches of 2 (for the error reporting)."""
    return FixedBatch(), _images(seed), nn.CrossEntropyLoss()


def wrong_head(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """A classifier whose layers do not fit together: its first forward pass fails."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 16), nn.Linear(32, CLASSES))
    return model, _images(seed), nn.CrossEntropyLoss()
