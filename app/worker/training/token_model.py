"""What a `tokens` check trains: a small deterministic language model on synthetic sequences
of varying valid length, or a registered model whose dataset yields token sequences.

A sample is `(input_ids, labels)`, two int64 tensors of `sequence_length` tokens; labels are
`IGNORE_INDEX` (-100, as torch's cross-entropy and Hugging Face use) where the loss ignores a
position (padding). The model maps input ids `[batch, sequence]` to logits `[batch, sequence,
vocabulary]`, and the loss is cross-entropy over the positions whose label is not ignored.
A registered factory for this workload returns `(model, dataset, loss_fn)` as for any check
model, with `dataset[i]` such a pair; the check computes the token cross-entropy itself (it
needs sums and counts of valid tokens, not a mean), so `loss_fn` is not called.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset

from app.worker.training.workload import Workload

IGNORE_INDEX = -100
PAD_ID = 0
VOCABULARY, WIDTH = 48, 16
DEFAULT_SEQUENCE_LENGTH = 16  # when the plan gives none
SAMPLES = 4096  # the registered example's dataset


class TinyLanguageModel(nn.Module):
    """Embedding, one causal layer (a running mean over earlier positions, then a linear map),
    and a language-model head. No dropout, no normalisation: a pure function of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        self.layer = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCABULARY)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        positions = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
        x = torch.tanh(
            self.layer(x.cumsum(dim=1) / positions)
        )  # causal: padding after a token never reaches it
        logits: torch.Tensor = self.head(x)
        return logits


def token_sample(index: int, seed: int, sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `index`: a valid length drawn from 1 to sequence_length, random tokens, then
    padding whose labels the loss ignores. The same on every rank (its own generator)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    length = int(torch.randint(1, sequence_length + 1, (1,), generator=generator))
    ids = torch.randint(1, VOCABULARY, (sequence_length + 1,), generator=generator)
    inputs, labels = ids[:-1].clone(), ids[1:].clone()
    inputs[length:] = PAD_ID
    labels[length:] = IGNORE_INDEX
    return inputs, labels


class TokenSequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, seed: int, sequence_length: int, size: int = SAMPLES) -> None:
        self.seed, self.sequence_length, self.size = seed, sequence_length, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return token_sample(index, self.seed, self.sequence_length)


def tiny_language_model(
    seed: int = 0, sequence_length: int = DEFAULT_SEQUENCE_LENGTH
) -> tuple[nn.Module, Dataset[Any], Any]:
    """A tiny language model on 4,096 synthetic token sequences of varying valid length (a
    factory to register for `"workload": "tokens"` checks, and to copy from)."""
    torch.manual_seed(seed)
    return TinyLanguageModel(), TokenSequences(seed, sequence_length), mean_token_loss


def mean_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss a factory returns: what a sample check and the smoke pass call (the tokens
    check itself sums and counts tokens)."""
    return token_loss(logits, labels, "mean")


def token_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
    """Cross-entropy over the valid tokens: their sum, or their mean (sum / their count)."""
    return functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum" if reduction == "sum" else "mean",
    )


def sequence_length_of(dataset: Dataset[Any]) -> int | None:
    """Tokens per sample of a dataset of token ids (`(input_ids, labels)` pairs, or dicts
    with `input_ids`), read from its first sample; None for any other data (images, features)."""
    sample = dataset[0]
    if isinstance(sample, dict):
        ids = sample.get("input_ids")
    else:
        ids = sample[0] if isinstance(sample, tuple | list) and sample else None
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dim() != 1:
        return None
    return int(ids.shape[0])


class TokenWorkload(Workload):
    """The built-in token model, or a registered one (`base`), with the token loss: `mean` is
    the mean over a batch's valid tokens, `sum` their sum."""

    def __init__(self, seed: int, sequence_length: int | None, base: Workload | None = None) -> None:
        self.sequence_length = sequence_length or DEFAULT_SEQUENCE_LENGTH
        self.base = base
        if base is None:
            torch.manual_seed(seed)
            self.template = TinyLanguageModel()
            dataset: Dataset[Any] = TokenSequences(seed, self.sequence_length, size=1 << 30)
            super().__init__("tokens", seed, dataset, mean_token_loss)
        else:
            super().__init__(base.name, seed, base.dataset, base.loss_fn)

    @property
    def dataset_size(self) -> int | None:
        return None if self.base is None else self.base.dataset_size

    @property
    def data_sequence_length(self) -> int | None:
        """Tokens per sample of what this check trains: the registered dataset's own length,
        which the plan's sequence_length does not change."""
        return self.sequence_length if self.base is None else sequence_length_of(self.base.dataset)

    def module(self, dtype: torch.dtype | None, device: torch.device) -> nn.Module:
        if self.base is not None:
            return self.base.module(dtype, device)
        return copy.deepcopy(self.template).to(device=device, dtype=dtype or torch.float64)

    def batch(
        self, indices: Sequence[int], dtype: torch.dtype | None, device: torch.device
    ) -> tuple[Any, Any]:
        if self.base is not None:
            return self.base.batch(indices, dtype, device)
        pairs = [token_sample(i, self.seed, self.sequence_length) for i in indices]
        inputs = torch.stack([p[0] for p in pairs]).to(device)
        labels = torch.stack([p[1] for p in pairs]).to(device)
        return inputs, labels

    def loss(self, module: nn.Module, x: Any, y: Any, reduction: str) -> torch.Tensor:
        return token_loss(module(x), y, reduction)

    def counts(self, indices: Sequence[int], device: torch.device) -> tuple[int, int]:
        """(valid tokens, all label positions) of a micro-batch."""
        _, labels = self.batch(indices, None, device)
        return int((labels != IGNORE_INDEX).sum()), int(labels.numel())
