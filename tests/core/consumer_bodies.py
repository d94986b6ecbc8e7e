"""The plans the consumer tests export and hand to the real tools, and the refusal every
data-parallel-only format gives a model-parallel plan (not a test module)."""

from __future__ import annotations

import pytest
from export_helpers import export_input

from app.core.exports.parts.export_types import ExportUnsupported
from app.core.exports.registry import export
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES

IMAGENET = EXAMPLES["dataset_and_lr"]["value"]  # the README's first plan
ADAM = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "global_batch_size": 1024,
    "dataset": {"num_samples": 100000, "epochs": 3},
    "learning_rate": {"base_lr": 0.0003, "base_batch_size": 256, "optimizer": "adam", "rule": "sqrt"},
}
# The README's model-parallel plan, and the issue's: tensor 2 on 16 GPUs.
README_MODEL_PARALLEL = {
    "topology": {"num_nodes": 4, "gpus_per_node": 8},
    "parallelism": {"tensor": 4, "pipeline": 2, "context": 1},
    "global_batch_size": 256,
    "max_micro_batch_size": 16,
}
TENSOR_2 = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "parallelism": {"tensor": 2},
    "global_batch_size": 256,
    "learning_rate": {"base_lr": 0.1, "warmup_steps": 10},
}
EVEN = {"imagenet": IMAGENET, "homogeneous": EXAMPLES["homogeneous"]["value"], "adam": ADAM}
MODEL_PARALLEL = {"readme": README_MODEL_PARALLEL, "tensor2": TENSOR_2}
UNEVEN = EXAMPLES["mixed"]["value"]  # the README's mixed cluster


def refuses_model_parallel(fmt: str) -> None:
    for body in MODEL_PARALLEL.values():
        x = export_input(body)
        with pytest.raises(ExportUnsupported, match="data-parallel only") as caught:
            export(fmt, x)
        assert caught.value.pointer == "/parallelism"
        assert f"not {x.plan.global_batch_size}" in caught.value.detail
