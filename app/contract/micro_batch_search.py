"""A check's search for the largest micro-batch that fits in one device's memory
(`result.micro_batch_search`, with `fit_micro_batch`), and the plan re-made under it, which is
what the check then ran. The search order is the pure `app.core.split.micro_batch_search`, the
trials run on rank 0 (`app.worker.measure.micro_batch_fit`); schemas/check_results.py's
MicroBatchSearchOut documents it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.contract.codec import FLAT
from app.core.split.micro_batch_search import Trial


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """What the trials found (`find_max_micro_batch`)."""

    max_micro_batch_size: int  # 0 when not even 1 fits
    capacity_bytes: int
    budget_bytes: int  # capacity_bytes less the safety margin
    safety_margin: float
    device: str
    optimizer: str  # the one the trials stepped (check_options.FIT_OPTIMIZERS)
    hit_limit: bool  # the search's limit fit: the real maximum may be larger
    peak_bytes_at_max: int | None
    bytes_per_sample: int | None  # the peaks' slope over the largest complete trials
    trials: tuple[Trial, ...]  # in the order they ran
    seconds: float


@dataclass(frozen=True, slots=True)
class SearchedSplit:
    """The split the request planned, before the search."""

    micro_batch_sizes: tuple[int, ...]  # distinct, ascending
    gradient_accumulation_steps: int


@dataclass(frozen=True, slots=True)
class ReplannedSplit:
    """The same global batch planned again under the cap that fits."""

    global_batch_size: int
    micro_batch_sizes: tuple[int, ...]  # distinct, ascending
    gradient_accumulation_steps: int
    max_micro_batch_size: int  # the cap the plan was made under
    # The plan request that gives this split, as POST /v1/plans takes it: a request's JSON.
    plan_request: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class MicroBatchSearch:
    fit: MemoryFit = field(metadata=FLAT)  # its keys stand in this object
    search_limit: int  # the largest size tried for: no larger micro-batch can help
    requested: SearchedSplit
    planned: ReplannedSplit
