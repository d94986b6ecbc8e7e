"""Example check-model factories, to register with BATCHPLAN_CHECK_MODELS and to copy from:

    BATCHPLAN_CHECK_MODELS="mlp=app.worker.example_models:mlp,quadratic=app.worker.example_models:quadratic"

`tiny_language_model` is the tokens workload's own model (app.worker.training.token_model), to
register for `"workload": "tokens"` checks.

Each returns `(model, dataset, loss_fn)` as `app.worker.training.workload` describes (`mlp` with
its referee, a held-out set and accuracy: app.worker.training.referee). `quadratic` has a
gradient noise scale known in closed form; the others each show one way a model stops being
DDP-equivalent.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, TensorDataset

# Registered by its name here, beside the other examples (app.worker.example_models:tiny_language_model).
from app.worker.training.token_model import tiny_language_model  # noqa: F401

FEATURES, HIDDEN, CLASSES = 12, 32, 5
SAMPLES = 4096

# quadratic: dimension, per-coordinate noise and the distance of the start from the optimum,
# chosen so that B_simple = D * SIGMA**2 / |theta - mu|**2 = 32 samples.
QUADRATIC_DIM, QUADRATIC_SIGMA, QUADRATIC_SAMPLES = 16, 1.0, 1 << 16
QUADRATIC_NOISE_SCALE = 32.0


def _classification(seed: int, samples: int = SAMPLES) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def _loss() -> nn.Module:
    return nn.CrossEntropyLoss()


def _held_out(seed: int, samples: int = 1024) -> TensorDataset:
    """Samples of `_classification(seed)`'s task that it never draws: the same teacher, the
    inputs after its own."""
    generator = torch.Generator().manual_seed(seed)
    torch.randn(SAMPLES, FEATURES, generator=generator)  # the training inputs, passed over
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    x = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The fraction of the batch whose highest logit is its class."""
    return (outputs.argmax(dim=1) == targets).double().mean()


def mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module, dict[str, Any]]:
    """A small classifier with nothing that breaks DDP equivalence.

    Its referee (a held-out set of its task, and accuracy) is what the lr-scaling probe judges
    it by."""
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES))
    referee = {"held_out": _held_out(seed), "metric": accuracy, "higher_is_better": True}
    return model, _classification(seed), _loss(), referee


def batchnorm_mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The classifier with a BatchNorm layer: statistics per micro-batch."""
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES)
    )
    return model, _classification(seed), _loss()


def dropout_mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The classifier with dropout: a random mask per forward pass."""
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Dropout(0.2), nn.Linear(HIDDEN, CLASSES))
    return model, _classification(seed), _loss()


def wide_mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """A classifier with a 4096-wide hidden layer, whose activations (about 50 KB a sample
    in float32) dominate its memory: for trying the micro-batch search on a small budget."""
    model = nn.Sequential(nn.Linear(FEATURES, 4096), nn.GELU(), nn.Linear(4096, CLASSES))
    return model, _classification(seed), _loss()


class RankScaled(nn.Module):
    """Scales its input by the rank: a layer that computes a different function on each rank."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        return x * (1.0 + 0.5 * rank)


def rank_dependent_mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The classifier with a layer that depends on the rank."""
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), RankScaled(), nn.GELU(), nn.Linear(HIDDEN, CLASSES))
    return model, _classification(seed), _loss()


class WithUnusedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES))
        self.auxiliary_head = nn.Linear(HIDDEN, 1)  # never called in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


def unused_parameter_mlp(seed: int = 0) -> tuple[nn.Module, Dataset[Any], nn.Module]:
    """The classifier with a head that the forward pass never uses."""
    return WithUnusedHead(), _classification(seed), _loss()


class Quadratic(nn.Module):
    """Per-sample loss 0.5 |theta - x|^2: the gradient of one sample is theta - x."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.theta.expand_as(x)


def quadratic_loss(prediction: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((prediction - x) ** 2).sum(dim=1).mean()


def quadratic_data(seed: int = 0) -> torch.Tensor:
    """Samples x ~ N(mu, SIGMA^2 I) with |mu|^2 = D SIGMA^2 / NOISE_SCALE, in float64."""
    generator = torch.Generator().manual_seed(seed)
    mu = torch.full(
        (QUADRATIC_DIM,), (QUADRATIC_SIGMA**2 / QUADRATIC_NOISE_SCALE) ** 0.5, dtype=torch.float64
    )
    noise = torch.randn(QUADRATIC_SAMPLES, QUADRATIC_DIM, generator=generator, dtype=torch.float64)
    return mu + QUADRATIC_SIGMA * noise


def quadratic_noise_scale(data: torch.Tensor, theta: torch.Tensor) -> float:
    """B_simple = tr(S) / |G|^2 of the dataset itself: G = theta - mean(x) and S the
    covariance of x (the per-sample gradients' covariance), both over the whole dataset."""
    data = data.double()
    gradient = theta.double() - data.mean(dim=0)
    trace = data.var(dim=0, unbiased=False).sum()
    return float(trace / gradient.pow(2).sum())


def quadratic(seed: int = 0) -> tuple[nn.Module, Dataset[Any], Any]:
    """Gaussian samples around a point; the noise scale at the start is 32 samples (closed form:
    D sigma^2 / |theta - mu|^2), for checking the noise-scale estimate."""
    data = quadratic_data(seed)
    return Quadratic(QUADRATIC_DIM).double(), TensorDataset(data, data), quadratic_loss
