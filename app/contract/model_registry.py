"""Check models an operator registers by name (`BATCHPLAN_CHECK_MODELS`).

A request names a model, never an import path: only what the operator listed can run in the
worker. Each entry is `name=package.module:factory`; the factory returns `(model, dataset,
loss_fn)` (see `app.worker.training.workload`). Pure: the web process parses and validates the
registry without importing torch or the operator's code.
"""

from __future__ import annotations

import difflib
import re

SYNTHETIC = "synthetic"  # the built-in model, always registered
# Registered unless the operator lists others: Swagger's `registered_model` example names it,
# and a default server runs it. It ships with batchplan and builds in milliseconds, in a rank
# process (the web process never imports it).
EXAMPLE_MODELS = "mlp=app.worker.example_models:mlp"
# What GET /v1/check-models says of a registered model until a rank has built it.
PROBE_PENDING = (
    "a rank process is building this model and running a forward and backward pass on two samples; "
    "loaded, error and what it built are null until it has (seconds, or as long as the factory takes)"
)
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
TARGET = re.compile(rf"^{_DOTTED}:{_DOTTED}$")


def parse_models(text: str) -> dict[str, str]:
    """`name=package.module:factory` entries separated by commas or whitespace."""
    models: dict[str, str] = {}
    for entry in re.split(r"[,\s]+", text.strip()):
        if not entry:
            continue
        name, sep, target = entry.partition("=")
        if not sep:
            raise ValueError(f"check model {entry!r}: write it as name=package.module:factory")
        if not NAME.match(name):
            raise ValueError(
                f"check model name {name!r}: a letter, then up to 63 letters, digits, '_', '.' or '-'"
            )
        if name == SYNTHETIC:
            raise ValueError(f"check model name {SYNTHETIC!r} is the built-in model's; pick another")
        if not TARGET.match(target):
            raise ValueError(f"check model {name!r}: target {target!r} is not package.module:factory")
        if name in models:
            raise ValueError(f"check model {name!r} is registered twice")
        models[name] = target
    return models


def unknown_model(name: str, registered: list[str]) -> str:
    """The 422 detail for a name that is not registered, with the nearest one."""
    names = [SYNTHETIC, *sorted(registered)]
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (
        f"no check model {name!r} on this worker; registered: {', '.join(names)}{hint} "
        f"(operators register models with BATCHPLAN_CHECK_MODELS=name=package.module:factory)"
    )


def sync_batch_norm_refusal(names: list[str]) -> str:
    """Why a check of a model with SyncBatchNorm layers in training cannot run on CPU: the
    422 at submission (the web process knows the layers from the model's description) and
    the error of a check started without one (the rank program)."""
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return (
        f"the model has {len(names)} SyncBatchNorm layer(s) in training mode ({shown}), which torch "
        f"runs on GPUs only (NCCL), and this check would run on CPU: check it on a worker with a GPU "
        f"per replica (there the single-process reference runs them as BatchNorm over the whole "
        f"batch, which proves SyncBatchNorm equivalent), or convert them back to BatchNorm for a "
        f"CPU check (which then shows what per-replica statistics cost)"
    )
