"""The torchrun program of the python skeleton's resume tests (tests/core/test_python_resume.py)
and bench/bench_elastic.py: the exported skeleton used as a person would, its build_model,
build_dataset and loss_fn replaced by the float64 toy of support/recipe_toys.py; the rest is
the skeleton's own (its checkpoint, its resume, its elastic table).

    torchrun ... resume_runner.py SKELETON NUM_SAMPLES OUT [skeleton arguments]

Rank 0 writes the parameters it ends with to OUT. RESUME_RUNNER_DELAY (seconds) slows each
micro-batch, so that a node killed by a test dies mid-run rather than after it.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.recipe_toys import PairDataset, build_model


def main() -> None:
    skeleton_path, num_samples, out, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    delay = float(os.environ.get("RESUME_RUNNER_DELAY", "0"))
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("skeleton", skeleton_path)
    assert spec is not None and spec.loader is not None
    skeleton = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(skeleton)
    built: list[torch.nn.Module] = []

    def model() -> torch.nn.Module:
        built.append(build_model())
        return built[-1]

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(delay)
        return torch.nn.functional.mse_loss(output, target)

    namespace: Any = skeleton
    namespace.build_model = model
    namespace.build_dataset = lambda: PairDataset(num_samples)
    namespace.loss_fn = loss
    sys.argv = [skeleton_path, *rest]
    skeleton.main()
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save({k: v.detach().clone() for k, v in built[-1].named_parameters()}, out)
    # The model this runner kept holds the process groups (FSDP's in reference cycles): free it
    # while Python is alive, as the skeleton frees its own (see the skeleton's end).
    built.clear()
    gc.collect()


if __name__ == "__main__":
    main()
