"""The check request's limits (`POST /v1/checks`, the rank program's `--request`): its own
fields' bounds and the plan request's (app.core.request.limits) under `plan`, one table.

The HTTP schema's fields read their bounds here (app.schemas.types.check_limit);
`check_request` holds JSON that did not come through that schema to it, and a kind's own
range checks read it too (`within`).
"""

from __future__ import annotations

from app.contract.check_options import (
    MAX_LR_PROBE_EPOCHS,
    MAX_LR_PROBE_POINTS,
    MAX_LR_PROBE_SAMPLES,
    MAX_LR_PROBE_SEEDS,
    MAX_STEPS,
    MAX_THROUGHPUT_POINTS,
)
from app.core.request.bounds import Bounds, Limits
from app.core.request.limits import PLAN_LIMITS

MAX_NODES = 4096  # hosts meeting at one rendezvous, and the replicas a resume check goes on with
MAX_SEED = 2**31 - 1
MAX_TIMEOUT_S = 3600
MAX_NOISE_STEPS = 256
MAX_SEARCHED_MICRO_BATCH = 1 << 20  # the micro-batch search's and the throughput measurement's
MAX_REPEATS = 1000

_CHECK = {
    "seed": Bounds("int", ge=0, le=MAX_SEED),
    "timeout_s": Bounds("float", gt=0, le=MAX_TIMEOUT_S, allow_null=True),
    "steps": Bounds("int", ge=1, le=MAX_STEPS),
    "noise_scale.steps": Bounds("int", ge=0, le=MAX_NOISE_STEPS),
    "noise_scale.learning_rate": Bounds("float", ge=0, le=1e6),
    "fit_micro_batch.memory_bytes": Bounds("int", ge=1 << 20, le=1 << 50, allow_null=True),
    "fit_micro_batch.safety_margin": Bounds("float", ge=0, lt=1, allow_null=True),
    "fit_micro_batch.max_micro_batch_size": Bounds("int", ge=1, le=MAX_SEARCHED_MICRO_BATCH),
    "rendezvous.nnodes": Bounds("int", ge=1, le=MAX_NODES),
    "resume.at_step": Bounds("int", ge=1, le=MAX_STEPS),
    "resume.data_parallel_size": Bounds("int", ge=1, le=MAX_NODES),
    "throughput.micro_batch_sizes": Bounds("items", ge=1, le=MAX_THROUGHPUT_POINTS, allow_null=True),
    "throughput.micro_batch_sizes[]": Bounds("int", ge=1, le=MAX_SEARCHED_MICRO_BATCH),
    "throughput.repeats": Bounds("int", ge=1, le=MAX_REPEATS),
    "throughput.warmup_steps": Bounds("int", ge=0, le=MAX_REPEATS),
    "throughput.margin": Bounds("float", ge=0, lt=1),
    "lr_scaling.samples": Bounds("int", ge=1, le=MAX_LR_PROBE_SAMPLES, allow_null=True),
    "lr_scaling.epochs": Bounds("float", gt=0, le=MAX_LR_PROBE_EPOCHS, allow_null=True),
    "lr_scaling.rules": Bounds("items", le=3, allow_null=True),
    "lr_scaling.points": Bounds("int", ge=1, le=MAX_LR_PROBE_POINTS),
    "lr_scaling.tolerance": Bounds("float", gt=0, le=1, allow_null=True),
    "lr_scaling.seeds": Bounds("int", ge=1, le=MAX_LR_PROBE_SEEDS),
    "lr_scaling.label_noise": Bounds("float", ge=0, le=100),
}

CHECK_LIMITS = Limits({**PLAN_LIMITS.under("plan"), **_CHECK})


def within(options: object, part: str) -> None:
    """Raise InvalidValue at the first field of `options` outside CHECK_LIMITS: a part of the
    check request as its record (`LrScalingOptions` as `lr_scaling`) built without the HTTP
    schema or `check_request`, which hold the same table."""
    prefix = f"{part}."
    names = {path.removeprefix(prefix).split("[")[0] for path in CHECK_LIMITS if path.startswith(prefix)}
    given = {name: getattr(options, name) for name in names}
    CHECK_LIMITS.check({part: {k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}})
