"""Check requests that Swagger shows for POST /v1/checks and that tests, the soak and the
benchmarks send: one copy, so the documented examples are the ones exercised. Plain dicts (as
app/schemas/examples.py); a kind's own come from its module (app.schemas.kinds), in the order
Swagger lists them.
"""

from __future__ import annotations

from typing import Any

from app.schemas.examples import h100_and_a100
from app.schemas.kinds import lr_scaling, resume, run, stream, throughput

CHECK_EXAMPLES: dict[str, dict[str, Any]] = {
    "even": {
        "summary": "4 replicas, global batch 64, 2 accumulation steps",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 4},
                "global_batch_size": 64,
                "micro_batch_size": 8,
            },
            "backend": "auto",
            "dtype": "float64",
            "seed": 0,
            "timeout_s": 120,
        },
    },
    "mixed": {
        "summary": "A mixed cluster with uneven micro-batches",
        "value": {
            "plan": h100_and_a100(
                {"num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
                {"num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
                global_batch_size=60,
                max_micro_batch_size=8,
            )
        },
    },
    "registered_model": {
        "summary": "An operator-registered model: equivalence, noise scale, largest micro-batch",
        "description": "The example `mlp`, which a server registers unless BATCHPLAN_CHECK_MODELS "
        "lists other models: BATCHPLAN_CHECK_MODELS=mlp=app.worker.example_models:mlp",
        "value": {
            "plan": {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 256},
            "model": "mlp",
            "noise_scale": {"steps": 8, "learning_rate": 0.0},
            "fit_micro_batch": {"memory_bytes": 85899345920, "safety_margin": 0.1, "optimizer": "adam"},
        },
    },
    "tokens": {
        "summary": "A token-normalised plan on sequences of uneven length",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 4},
                "sequence_length": 16,
                "global_batch_tokens": 256,
                "micro_batch_tokens": 32,
                "loss_normalization": "token",
            },
            "workload": "tokens",
        },
    },
    **run.EXAMPLES,
    **resume.EXAMPLES,
    "mesh": {
        "summary": "The plan's own mesh: 2 pipeline stages, 4 micro-batches per schedule",
        "description": "One process per mesh rank; the result reports `mesh` and `wrapper`.",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 2},
                "micro_batch_size": 3,
                "gradient_accumulation_steps": 4,
                "parallelism": {"pipeline": 2},
            }
        },
    },
    **throughput.EXAMPLES,
    **lr_scaling.EXAMPLES,
    **stream.EXAMPLES,
}
