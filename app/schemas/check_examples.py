"""Check requests that Swagger shows for POST /v1/checks and that tests, the soak and the
benchmarks send: one copy, so the documented examples are the ones exercised.

Plain dicts, no pydantic (as app/schemas/examples.py): a load generator imports them cheaply.
"""

from __future__ import annotations

from typing import Any

from app.schemas.examples import h100_and_a100


def _two_epoch_plan(**body: Any) -> dict[str, Any]:
    """The plan the run and resume examples train 20 steps of: 10 steps an epoch on 4 replicas."""
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 32,
        "micro_batch_size": 4,
        "dataset": {"num_samples": 320, "shuffle": True, "seed": 0},
        **body,
    }


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
    "run": {
        "summary": "A run, not one step: 20 optimizer steps of a recipe over two epochs",
        "description": "The ranks train the plan's recipe (warmup, cosine decay, weight decay, clipping) "
        "through its sampler across an epoch boundary; every step is held against a single-process "
        "reference run, beside the run-level controls. The result's `trajectory` lists the steps; "
        "GET /v1/checks/{id}/trajectory.png draws them.",
        "value": {
            "plan": _two_epoch_plan(
                learning_rate={
                    "base_lr": 0.1,
                    "rule": "none",
                    "warmup_steps": 4,
                    "warmup_start_lr": 0.0,
                    "decay": "cosine",
                    "train_steps": 20,
                    "weight_decay": 0.01,
                    "max_grad_norm": 0.5,
                },
            ),
            "steps": 20,
        },
    },
    "resume": {
        "summary": "Lose half the replicas mid-run: checkpoint after 7 steps on 4, resume on 2",
        "description": "The ranks train 7 optimizer steps on the plan's 4 replicas, checkpoint, and go on "
        "from step 7 on 2 (the plan re-made for 2 replicas with the same global batch: micro-batch 4, "
        "accumulation 4), each skipping what the plan's resume says; the whole run is held against the "
        "uninterrupted single-process reference, beside the resume controls. The result's `resume` "
        "says where each replica resumed.",
        "value": {
            "plan": _two_epoch_plan(),
            "steps": 20,
            "resume": {"at_step": 7, "data_parallel_size": 2},
        },
    },
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
    "throughput": {
        "summary": "Measure the throughput curve: samples/s of one replica at 8 micro-batch sizes",
        "description": "After the check, rank 0 times one replica's micro-step at each size; the "
        "result's `throughput.curve` is what topology.throughput_curve takes.",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 2},
                "global_batch_size": 64,
                "max_micro_batch_size": 128,
            },
            "throughput": {"micro_batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128], "repeats": 10},
        },
    },
}
