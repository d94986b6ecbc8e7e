"""DeepSpeed in a process group of one on gloo, for the probes that read its config and
schedulers (deepspeed_probe.py, schedule_probe.py). Not a test module."""

from __future__ import annotations

import os


def init_gloo() -> None:
    """init_distributed would compile DeepSpeed's shared-memory all-reduce kernel (a C++ op, 30 s
    and more, again for each venv path: 70 CPU-s of cc1plus in a CI run) that no number the
    probes read goes through; marked not compatible, as on any host it cannot build on,
    DeepSpeed runs on gloo alone."""
    import deepspeed
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    deepspeed.init_distributed(dist_backend="gloo")
