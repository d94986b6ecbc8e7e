"""Loads a TOML job config with torchtitan's own ConfigManager and prints what torchtitan
reads from it, as JSON (run as a script by tests/core/test_exports_language_models.py).

torchtitan 0.2.2 is the last release that reads TOML job configs (0.3 replaced them with a
Python config registry), and its package `__init__` imports the float8/MoE quantization code,
which needs triton, a GPU compiler that this CPU environment does not install (installing it
would also make every `import torch._dynamo` import triton). So the `torchtitan` package is
registered without running that `__init__`: everything below it (config/, tools/,
distributed/parallel_dims.py) is torchtitan's own code, imported as installed. A separate
process, so the test process never holds the stand-in package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path


def _package_without_init() -> None:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchtitan is not installed")
    package = importlib.util.module_from_spec(
        importlib.machinery.ModuleSpec("torchtitan", None, is_package=True)
    )
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["torchtitan"] = package


def main(path: str, world_size: int) -> None:
    _package_without_init()
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    config = ConfigManager().parse_args(["--job.config_file", path])
    par = config.parallelism
    dims = ParallelDims(  # its own validation: the degrees multiply to the world size
        dp_replicate=par.data_parallel_replicate_degree,
        dp_shard=par.data_parallel_shard_degree,
        cp=par.context_parallel_degree,
        tp=par.tensor_parallel_degree,
        pp=par.pipeline_parallel_degree,
        ep=1,
        etp=1,
        world_size=world_size,
    )
    t, o, s = config.training, config.optimizer, config.lr_scheduler
    print(
        json.dumps(
            {
                "local_batch_size": t.local_batch_size,
                "global_batch_size": t.global_batch_size,
                "seq_len": t.seq_len,
                "steps": t.steps,
                "num_workers": t.dataloader.num_workers,
                "batch_degree": dims.dp_replicate * dims.dp_shard,
                "dp_replicate": dims.dp_replicate,
                "dp_shard": dims.dp_shard,
                "optimizer": {"name": o.name, "lr": o.lr, "eps": o.eps, "weight_decay": o.weight_decay},
                "lr_scheduler": {"warmup_steps": s.warmup_steps, "decay_ratio": s.decay_ratio},
                "torchtitan_file": str(Path(sys.modules["torchtitan.config.manager"].__file__ or "")),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
