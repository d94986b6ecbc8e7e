"""Megatron's micro-batch calculators, straight from the installed megatron-core (not a test
module). `megatron.core`'s package import pulls in its model stack; the calculator module
itself needs only the standard library, so it is loaded from its file. None where
megatron-core is not installed (the `consumers` group)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from types import ModuleType

_PATH = "megatron/core/num_microbatches_calculator.py"


def calculator_module() -> ModuleType | None:
    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.spec_from_file_location("megatron_num_microbatches", dist.locate_file(_PATH))
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
