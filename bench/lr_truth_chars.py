"""bench_lr_truth.py's second workload: a character language model on Python's own standard
library source (what every Python ships), far from converged within its run. Each sample is
16 characters of context and the next one; its referee is its held-out cross-entropy in nats
(lower is better) on text of other modules."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

CONTEXT, SAMPLES, HELD_OUT = 16, 16384, 2048
MODULES = ("argparse.py", "collections/__init__.py", "dataclasses.py", "inspect.py", "typing.py")
HELD_OUT_MODULES = ("functools.py", "enum.py")


def _text(names: tuple[str, ...]) -> bytes:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return b"".join((lib / name).read_bytes() for name in names)


def _samples(text: bytes, count: int) -> TensorDataset:
    """`count` windows at evenly spaced offsets: 16 bytes of context and the next byte."""
    data = torch.tensor(list(text), dtype=torch.int64).clamp(max=127)
    starts = torch.linspace(0, len(data) - CONTEXT - 2, count).long()
    windows = data[starts[:, None] + torch.arange(CONTEXT + 1)]
    return TensorDataset(windows[:, :CONTEXT], windows[:, CONTEXT])


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs.double(), targets)


def chars(seed: int = 0) -> tuple[nn.Module, TensorDataset, Any, dict[str, Any]]:
    """An embedding and a two-layer MLP over the 16-character context, 128 ASCII classes."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Embedding(128, 16), nn.Flatten(), nn.Linear(16 * CONTEXT, 128), nn.ReLU(), nn.Linear(128, 128)
    )
    held = _samples(_text(HELD_OUT_MODULES), HELD_OUT)
    referee = {"held_out": held, "metric": cross_entropy, "name": "cross_entropy", "higher_is_better": False}
    return model, _samples(_text(MODULES), SAMPLES), nn.CrossEntropyLoss(), referee
