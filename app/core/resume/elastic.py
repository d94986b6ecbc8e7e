"""Elastic batch plans: one global batch that a range of GPU counts can all run.

The search is DeepSpeed's elasticity v0.1 (`deepspeed/elasticity/elasticity.py`): candidate
batches are each allowed micro-batch, and their least common multiple, scaled by the largest
highly composite number that keeps them within the cap (highly composite numbers have the
most divisors for their size, so they suit the most GPU counts). The winner is the candidate
that the most GPU counts in [min_gpus, max_gpus] divide into whole micro-batches; ties go to
the larger batch with `prefer_larger`, else the smaller. Each count then takes the largest
allowed micro-batch that divides its share, as DeepSpeed's runtime does, and the rest is
gradient accumulation. The global batch is the same at every count, so the learning rate is too.

GPU counts here are data-parallel sizes (DeepSpeed's "world size" is the data-parallel size).
Divisors come from prime factorisations rather than by trying every count in the range, so a
wide range costs no more than a narrow one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from app.core.errors.domain import DomainError, InfeasiblePlan, InvalidValue, passes
from app.core.errors.suggestions import keep_working, nearest_working
from app.core.learning_rate.rules import plan_learning_rate
from app.core.records.plan import LearningRatePlan
from app.core.records.plan_request import MAX_SAFE_INTEGER, MAX_WORLD_SIZE, DatasetSpec, LearningRateSpec
from app.core.records.record import record
from app.core.resume.elastic_resume import CountResume, ElasticResumeSpec, count_resumes

# The 38 smallest highly composite numbers, as DeepSpeed lists them (enough for 720K x base).
HCN = (
    1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560,
    10080, 15120, 20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760,
    277200, 332640, 498960, 554400, 665280, 720720,
)  # fmt: skip

MAX_MICRO_BATCH = 1 << 20  # factorised by trial division: keep that cheap
MAX_MICRO_CHOICES = 64
MAX_COUNTS_LISTED = 10_000  # the response lists every valid count: bound it
RANGE_TRIES = 64  # GPU bounds tried for a suggestion (a search takes well under a millisecond)


@record
class ElasticRequest:
    min_gpus: int
    max_gpus: int
    micro_batch_sizes: tuple[int, ...]
    max_global_batch_size: int
    prefer_larger: bool = True
    learning_rate: LearningRateSpec | None = None
    # The resume on every count (app.core.resume.elastic_resume): the data and where the run stopped.
    dataset: DatasetSpec | None = None
    resume: ElasticResumeSpec | None = None


@record
class ElasticCount:
    gpus: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    resume: CountResume | None = None


@record
class ElasticPlan:
    global_batch_size: int
    valid_gpus: tuple[int, ...]
    counts: tuple[ElasticCount, ...]
    candidates: tuple[int, ...]  # the batches considered, ascending
    coverage: float  # share of the GPU counts in the range that work
    learning_rate: LearningRatePlan | None
    warnings: tuple[str, ...]


def _factorise(n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def _merge(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {p: a.get(p, 0) + b.get(p, 0) for p in a.keys() | b.keys()}


def _divisors_upto(factors: dict[int, int], limit: int) -> Iterator[int]:
    """Divisors of the number with these prime factors that are <= limit (pruned as built)."""
    divisors = [1]
    for p, e in factors.items():
        grown = []
        for d in divisors:
            value = d
            for _ in range(e):
                value *= p
                if value > limit:
                    break
                grown.append(value)
        divisors += grown
    yield from divisors


def _candidates(micros: tuple[int, ...], max_batch: int) -> dict[int, dict[int, int]]:
    """DeepSpeed's candidates, each with its prime factors: every base (each micro-batch and
    their LCM) times the largest highly composite number that keeps it within `max_batch`;
    bases over the cap are skipped. The factors come from the small parts, never from
    factorising the (possibly 2**53-sized) product."""
    micro_factors = [_factorise(m) for m in micros]
    lcm_factors: dict[int, int] = {}
    for f in micro_factors:
        lcm_factors = {p: max(lcm_factors.get(p, 0), f.get(p, 0)) for p in lcm_factors.keys() | f.keys()}
    out: dict[int, dict[int, int]] = {}
    for base, factors in [*zip(micros, micro_factors, strict=True), (math.lcm(*micros), lcm_factors)]:
        if base > max_batch:
            continue
        scale = max(h for h in HCN if h * base <= max_batch)
        out.setdefault(scale * base, _merge(_factorise(scale), factors))
    return dict(sorted(out.items()))


def candidate_batch_sizes(micro_batch_sizes: tuple[int, ...], max_batch: int) -> list[int]:
    return list(_candidates(tuple(sorted(set(micro_batch_sizes))), max_batch))


def _valid_counts(
    batch: int, factors: dict[int, int], micros: tuple[int, ...], low: int, high: int
) -> dict[int, int]:
    """{gpus: largest micro-batch} for every count in [low, high] with gpus x micro | batch."""
    best: dict[int, int] = {}
    for micro in micros:
        if batch % micro:
            continue
        per_micro = dict(factors)
        for p, e in _factorise(micro).items():
            per_micro[p] -= e
        for gpus in _divisors_upto({p: e for p, e in per_micro.items() if e}, high):
            if gpus >= low and micro > best.get(gpus, 0):
                best[gpus] = micro
    return best


def _validate(request: ElasticRequest) -> tuple[int, ...]:
    if not 1 <= request.min_gpus <= MAX_WORLD_SIZE:
        raise InvalidValue(f"min_gpus must be from 1 to {MAX_WORLD_SIZE}", pointer="/min_gpus")
    if not request.min_gpus <= request.max_gpus <= MAX_WORLD_SIZE:
        raise InvalidValue(
            f"max_gpus must be from min_gpus ({request.min_gpus}) to {MAX_WORLD_SIZE}",
            pointer="/max_gpus",
            suggestions={"max_gpus": [request.min_gpus]},
        )
    if not 1 <= request.max_global_batch_size <= MAX_SAFE_INTEGER:
        raise InvalidValue(
            f"max_global_batch_size must be from 1 to {MAX_SAFE_INTEGER}", pointer="/max_global_batch_size"
        )
    micros = tuple(sorted(set(request.micro_batch_sizes)))
    if not micros or len(micros) > MAX_MICRO_CHOICES:
        raise InvalidValue(f"give 1 to {MAX_MICRO_CHOICES} micro-batch sizes", pointer="/micro_batch_sizes")
    for i, micro in enumerate(request.micro_batch_sizes):
        if not 1 <= micro <= MAX_MICRO_BATCH:
            raise InvalidValue(
                f"micro-batch sizes must be from 1 to {MAX_MICRO_BATCH}", pointer=f"/micro_batch_sizes/{i}"
            )
    too_big = [m for m in micros if m > request.max_global_batch_size]
    if too_big:
        # DeepSpeed refuses this outright: a micro-batch over the global cap can never run.
        raise InvalidValue(
            f"micro-batch sizes {too_big} exceed max_global_batch_size {request.max_global_batch_size}",
            pointer="/micro_batch_sizes",
            suggestions={"max_global_batch_size": [max(micros)]},
        )
    return micros


def elastic_plan(request: ElasticRequest) -> ElasticPlan:
    """DeepSpeed's search; a request it refuses raises with only the suggestions that, each
    substituted alone, let the search succeed (app.core.errors.suggestions)."""
    try:
        return _elastic_plan(request)
    except DomainError as err:
        if isinstance(err, InfeasiblePlan) or err.pointer == "/max_gpus":
            # A GPU range that no batch suits: the nearest bounds that one does suit.
            for key in ("min_gpus", "max_gpus"):
                found = nearest_working(request, key, MAX_WORLD_SIZE, _plans, RANGE_TRIES)
                err.suggestions = {**err.suggestions, key: found} if found else err.suggestions
        raise keep_working(request, err, _plans) from None


def _elastic_plan(request: ElasticRequest) -> ElasticPlan:
    micros = _validate(request)
    low, high = request.min_gpus, request.max_gpus
    candidates = _candidates(micros, request.max_global_batch_size)
    best_batch, best_counts = 0, dict[int, int]()
    for batch, factors in candidates.items():
        counts = _valid_counts(batch, factors, micros, low, high)
        better = len(counts) > len(best_counts) or (
            len(counts) == len(best_counts)
            and counts
            and (batch > best_batch if request.prefer_larger else batch < best_batch)
        )
        if better:
            best_batch, best_counts = batch, counts
    if not best_counts:
        raise InfeasiblePlan(
            f"no GPU count from {low} to {high} divides any candidate batch {list(candidates)} into the "
            f"micro-batch sizes {list(micros)}; widen the GPU range or allow a micro-batch of 1",
            pointer="/max_gpus",
            # The smallest size made 1, which every GPU count divides into (when the cap allows).
            suggestions={f"micro_batch_sizes.{request.micro_batch_sizes.index(micros[0])}": [1]},
        )
    if len(best_counts) > MAX_COUNTS_LISTED:
        raise InvalidValue(
            f"{len(best_counts)} GPU counts work; narrow the range so at most {MAX_COUNTS_LISTED} are listed",
            pointer="/max_gpus",
        )
    listed = tuple(
        ElasticCount(gpus, micro, best_batch // (gpus * micro)) for gpus, micro in sorted(best_counts.items())
    )
    if request.resume is not None:
        shapes = [(c.gpus, c.micro_batch_size, c.gradient_accumulation_steps) for c in listed]
        resumes = count_resumes(shapes, best_batch, request.dataset, request.resume)
        listed = tuple(dataclasses.replace(c, resume=r) for c, r in zip(listed, resumes, strict=True))
    warnings = []
    if best_batch < request.max_global_batch_size:
        warnings.append(
            f"the global batch is {best_batch}, below the cap {request.max_global_batch_size}: "
            f"it is the candidate that the most GPU counts divide"
        )
    lr = None
    if request.learning_rate is not None:
        lr, lr_warnings = plan_learning_rate(request.learning_rate, best_batch, None)
        warnings += lr_warnings
    return ElasticPlan(
        global_batch_size=best_batch,
        valid_gpus=tuple(c.gpus for c in listed),
        counts=listed,
        candidates=tuple(candidates),
        coverage=len(listed) / (high - low + 1),
        learning_rate=lr,
        warnings=tuple(warnings),
    )


_plans = passes(_elastic_plan, DomainError)  # whether a request plans: how a suggestion is tried
