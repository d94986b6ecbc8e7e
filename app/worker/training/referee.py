"""A factory's own referee for the lr-scaling probe: its held-out dataset and a metric of the
model's outputs and targets, and whether higher is better. A factory returns it as a fourth
element beside `(model, dataset, loss_fn)`:

    return model, train_set, loss_fn, {
        "held_out": validation_set,          # map-style, (input, target) pairs like the dataset
        "metric": accuracy,                  # metric(outputs, targets): the batch's mean, a number
        "name": "accuracy",                  # optional: the metric function's name
        "higher_is_better": True,
    }

Without it the probe holds out a fifth of the training data and judges by the loss; a user
judges by their own validation set and metric (runs with 1.3-3x the loss were within a point
of the base run's accuracy)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from app.contract.targets import FactoryError

REFEREE_KEYS = ("held_out", "metric", "name", "higher_is_better")


@dataclass(frozen=True, slots=True)
class Referee:
    held_out: Dataset[Any]
    metric: Callable[[Any, Any], Any]
    name: str
    higher_is_better: bool
    size: int

    def score(self, outputs: Any, targets: Any) -> float | None:
        """The metric of a batch's outputs as a float; None when it is not finite."""
        value = self.metric(outputs, targets)
        number = float(value.item() if isinstance(value, torch.Tensor) else value)
        return number if math.isfinite(number) else None


def referee_of(target: str, value: Any) -> Referee:
    """The factory's fourth element read as a referee; a FactoryError naming what is wrong."""
    if not isinstance(value, Mapping):
        raise FactoryError(
            f"{target}: the fourth element is a {type(value).__name__}; give a dict with "
            "held_out (a dataset), metric (outputs, targets -> number) and higher_is_better"
        )
    unknown = sorted(set(value) - set(REFEREE_KEYS))
    if unknown:
        raise FactoryError(
            f"{target}: the referee has no key {unknown[0]!r}; its keys: {', '.join(REFEREE_KEYS)}"
        )
    metric, held_out, higher = value.get("metric"), value.get("held_out"), value.get("higher_is_better")
    if not callable(metric):
        raise FactoryError(f"{target}: the referee's metric is not callable (metric(outputs, targets))")
    if not isinstance(higher, bool):
        raise FactoryError(f"{target}: the referee needs higher_is_better, True or False")
    try:
        size = len(held_out)  # type: ignore[arg-type]
    except TypeError as err:
        raise FactoryError(
            f"{target}: the referee's held_out has no len(); give a map-style dataset"
        ) from err
    if size < 1:
        raise FactoryError(f"{target}: the referee's held_out dataset is empty")
    name = value.get("name") or getattr(metric, "__name__", "metric")
    return Referee(held_out, metric, str(name), higher, int(size))  # type: ignore[arg-type]
