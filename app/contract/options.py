"""A check's options beyond the plan, typed: the noise-scale measurement, the search for the
largest micro-batch and the rendezvous of a check across hosts. Each reads the JSON of its
field in a check request (`from_json`) and writes it back (`to_json`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.contract.check_options import DEFAULT_FIT_LIMIT, DEFAULT_FIT_OPTIMIZER, DEFAULT_NOISE_STEPS


@dataclass(frozen=True, slots=True)
class NoiseOptions:
    """Measure the gradient noise scale over `steps` optimizer steps (0: not at all), with
    plain SGD at `learning_rate` between them (0: every step at the starting weights)."""

    steps: int = DEFAULT_NOISE_STEPS
    learning_rate: float = 0.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NoiseOptions:
        return cls(int(data.get("steps", DEFAULT_NOISE_STEPS)), float(data.get("learning_rate", 0.0)))


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Find the largest micro-batch that fits in `memory_bytes` (None: the GPU's own memory)
    less `safety_margin` (None: the device's default), then re-plan under it."""

    memory_bytes: int | None = None
    safety_margin: float | None = None
    optimizer: str = DEFAULT_FIT_OPTIMIZER
    max_micro_batch_size: int = DEFAULT_FIT_LIMIT

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FitOptions:
        defaults = cls()
        return cls(
            memory_bytes=data.get("memory_bytes"),
            safety_margin=data.get("safety_margin"),
            optimizer=data.get("optimizer") or defaults.optimizer,
            max_micro_batch_size=int(data.get("max_micro_batch_size") or defaults.max_micro_batch_size),
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """One check across hosts: every node's worker meets at `endpoint` under `run_id`."""

    endpoint: str
    nnodes: int
    run_id: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rendezvous:
        return cls(str(data["endpoint"]), int(data["nnodes"]), str(data["run_id"]))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
