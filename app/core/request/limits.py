"""The ranges of CONTRACT.md "Limits", for a plan request that did not come through the HTTP
schema (which states the same ranges as its fields' constraints and refuses first): the rank
program's and a local check's JSON (`app.contract.request.check_request`). The planner
trusts its request and checks none of this again: a request is validated once, where it
comes in.
"""

from __future__ import annotations

import math

from app.core.errors.domain import InvalidValue, field_key
from app.core.records.plan_request import MAX_SAFE_INTEGER, PlanRequest


def check_limits(request: PlanRequest) -> None:
    """Raise InvalidValue at the first count or number outside CONTRACT.md's "Limits"."""
    counts: list[tuple[str, int | None, int]] = [
        ("/global_batch_size", request.global_batch_size, 1),
        ("/micro_batch_size", request.micro_batch_size, 1),
        ("/gradient_accumulation_steps", request.gradient_accumulation_steps, 1),
        ("/max_micro_batch_size", request.max_micro_batch_size, 1),
        ("/parallelism/tensor", request.parallelism.tensor, 1),
        ("/parallelism/pipeline", request.parallelism.pipeline, 1),
        ("/parallelism/context", request.parallelism.context, 1),
        ("/parallelism/data_parallel_shard", request.parallelism.data_parallel_shard, 1),
        ("/parallelism/expert", request.parallelism.expert, 1),
    ]
    if request.dataset is not None:
        counts += [
            ("/dataset/num_samples", request.dataset.num_samples, 1),
            ("/dataset/seed", request.dataset.seed, 0),
            ("/dataset/epochs", request.dataset.epochs, 1),
        ]
    lr = request.learning_rate
    if lr is not None:
        counts += [
            ("/learning_rate/base_batch_size", lr.base_batch_size, 1),
            ("/learning_rate/warmup_steps", lr.warmup_steps, 0),
            ("/learning_rate/train_steps", lr.train_steps, 1),
            ("/learning_rate/train_samples", lr.train_samples, 1),
        ]
        for pointer, value in (("/learning_rate/base_lr", lr.base_lr), ("/learning_rate/eps", lr.eps)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InvalidValue(f"{pointer.rsplit('/', 1)[1]} must be finite and > 0", pointer=pointer)
        epochs = lr.warmup_epochs
        if epochs is not None and not (math.isfinite(epochs) and epochs >= 0):
            raise InvalidValue(
                "warmup_epochs must be finite and >= 0", pointer="/learning_rate/warmup_epochs"
            )
        for beta in lr.betas:
            if not 0 <= beta < 1:
                raise InvalidValue("betas must lie in [0, 1)", pointer="/learning_rate/betas")
    noise, stderr = request.gradient_noise_scale, request.gradient_noise_scale_stderr
    if noise is not None and not (math.isfinite(noise) and noise > 0):
        raise InvalidValue("gradient_noise_scale must be finite and > 0", pointer="/gradient_noise_scale")
    if stderr is not None and not (math.isfinite(stderr) and stderr >= 0):
        raise InvalidValue(
            "gradient_noise_scale_stderr must be finite and >= 0",
            pointer="/gradient_noise_scale_stderr",
        )
    for pointer, number, low in counts:
        # A plain int in range, the usual case, is one type test and one comparison.
        if number is None or (type(number) is int and low <= number <= MAX_SAFE_INTEGER):
            continue
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= MAX_SAFE_INTEGER:
            name = pointer.rsplit("/", 1)[1]
            nearest_ok = min(max(number, low), MAX_SAFE_INTEGER) if isinstance(number, int) else low
            raise InvalidValue(
                f"{name} must be a whole number from {low} to {MAX_SAFE_INTEGER}",
                pointer=pointer,
                suggestions={field_key(pointer): [nearest_ok]},
            )
