"""Plan requests that Swagger shows (POST /v1/plans and the schedule request) and that tests
and benchmarks send: one copy, so the documented examples are the ones exercised.

Plain dicts, no pydantic: a benchmark's load generator imports them cheaply.
"""

from __future__ import annotations

import copy
from typing import Any

PLAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "homogeneous": {
        "summary": "16 GPUs, global batch 512",
        "value": {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512},
    },
    "dataset_and_lr": {
        "summary": "ImageNet on 16 GPUs with a scaled learning rate and warmup",
        "value": {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "global_batch_size": 512,
            "dataset": {"num_samples": 1281167, "shuffle": True, "seed": 0, "drop_last": False, "epochs": 90},
            "learning_rate": {
                "base_lr": 0.1,
                "base_batch_size": 256,
                "rule": "linear",
                "optimizer": "sgd",
                "warmup_epochs": 5,
            },
        },
    },
    "mixed": {
        "summary": "Mixed H100 and A100 nodes, split by throughput",
        "value": {
            "topology": {
                "node_groups": [
                    {
                        "name": "h100",
                        "num_nodes": 2,
                        "gpus_per_node": 8,
                        "relative_throughput": 2.0,
                        "max_micro_batch_size": 64,
                    },
                    {
                        "name": "a100",
                        "num_nodes": 1,
                        "gpus_per_node": 4,
                        "relative_throughput": 1.0,
                        "max_micro_batch_size": 32,
                    },
                ]
            },
            "global_batch_size": 1000,
            "dataset": {"num_samples": 100000},
        },
    },
    "mixed_curves": {
        "summary": "Mixed H100 and A100 nodes, split by their measured throughput curves",
        "value": {
            "topology": {
                "node_groups": [
                    {
                        "name": "h100",
                        "num_nodes": 2,
                        "gpus_per_node": 8,
                        "max_micro_batch_size": 64,
                        "throughput_curve": [
                            {"micro_batch_size": 8, "samples_per_s": 960.0},
                            {"micro_batch_size": 16, "samples_per_s": 1840.0},
                            {"micro_batch_size": 32, "samples_per_s": 2600.0},
                            {"micro_batch_size": 64, "samples_per_s": 2700.0},
                        ],
                    },
                    {
                        "name": "a100",
                        "num_nodes": 1,
                        "gpus_per_node": 4,
                        "max_micro_batch_size": 32,
                        "throughput_curve": [
                            {"micro_batch_size": 8, "samples_per_s": 520.0},
                            {"micro_batch_size": 16, "samples_per_s": 880.0},
                            {"micro_batch_size": 32, "samples_per_s": 1000.0},
                        ],
                    },
                ]
            },
            "global_batch_size": 1024,
            "dataset": {"num_samples": 100000},
        },
    },
    "measured_lr": {
        "summary": "The lr scaled by the rule an lr-scaling probe measured best",
        "value": {
            "topology": {"num_nodes": 1, "gpus_per_node": 8},
            "global_batch_size": 512,
            "learning_rate": {
                "base_lr": 0.1,
                "base_batch_size": 64,
                "warmup_steps": 100,
                "train_steps": 2000,
                "rule": "measured",
                "lr_scaling": {
                    "base": {"batch_size": 64, "lr": 0.1},
                    "rules": [
                        {"rule": "none", "lr": 0.1, "final_loss_ratio": 1.09, "holds": False},
                        {"rule": "sqrt", "lr": 0.282842712474619, "final_loss_ratio": 1.031, "holds": False},
                        {"rule": "linear", "lr": 0.8, "final_loss_ratio": 1.012, "holds": True},
                    ],
                    "best_rule": "linear",
                    "plan_rule_holds": True,
                    "regime": "linear",
                    "verdict": "at 512, linear scaling to 0.8 keeps the loss within 1.2 % of the 64-sample "
                    "run over 50,000 samples; sqrt lags by 3.1 %",
                },
            },
        },
    },
    "megatron": {
        "summary": "Tensor and pipeline parallel, capped micro-batch, Adam",
        "value": {
            "topology": {"num_nodes": 4, "gpus_per_node": 8},
            "parallelism": {"tensor": 4, "pipeline": 2, "context": 1},
            "global_batch_size": 1024,
            "max_micro_batch_size": 16,
            "learning_rate": {
                "base_lr": 0.0003,
                "base_batch_size": 256,
                "optimizer": "adamw",
                "rule": "auto",
                "warmup_steps": 2000,
            },
        },
    },
    "round_down": {
        "summary": "A batch that does not divide, moved to the nearest feasible value",
        "value": {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "global_batch_size": 1000,
            "micro_batch_size": 32,
            "divisibility": "round_down",
        },
    },
    "mesh_2d": {
        "summary": "A 2-D mesh: data parallel x tensor parallel (DDP replicas of TP pairs)",
        "value": {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "parallelism": {"tensor": 2},
            "global_batch_size": 256,
        },
    },
    "mesh_3d": {
        "summary": "A 3-D mesh: pipeline x FSDP x tensor parallel, the schedule's micro-batches accumulated",
        "value": {
            "topology": {"num_nodes": 4, "gpus_per_node": 8},
            "parallelism": {"tensor": 4, "pipeline": 2, "data_parallel_shard": 4},
            "global_batch_size": 256,
            "micro_batch_size": 8,
        },
    },
    "noise_scale": {
        "summary": "A measured gradient noise scale: how efficient is this global batch?",
        "value": {
            "topology": {"num_nodes": 4, "gpus_per_node": 8},
            "global_batch_size": 1024,
            "gradient_noise_scale": 4096,
            "gradient_noise_scale_stderr": 300,
        },
    },
    "language_model": {
        "summary": "A language model planned in tokens, its loss normalised by tokens",
        "value": {
            "topology": {"num_nodes": 4, "gpus_per_node": 8},
            "parallelism": {"tensor": 2, "pipeline": 1, "context": 1},
            "sequence_length": 4096,
            "global_batch_tokens": 4194304,
            "micro_batch_tokens": 8192,
            "loss_normalization": "token",
            "dataset": {"num_samples": 2000000, "epochs": 1},
            "learning_rate": {
                "base_lr": 0.0003,
                "base_batch_tokens": 1048576,
                "optimizer": "adamw",
                "rule": "sqrt",
                # From lr / (warmup_steps + 1), the warmup torchtitan's scheduler runs: its export
                # is then exact (lr 0.0006 = 0.0003 x sqrt(4194304 / 1048576)).
                "warmup_steps": 99,
                "warmup_start_lr": 0.000006,
            },
        },
    },
}


def plan_example(name: str) -> dict[str, Any]:
    """The request body of `PLAN_EXAMPLES[name]`, a copy the caller may change."""
    return copy.deepcopy(PLAN_EXAMPLES[name]["value"])


# Requests the service refuses, for the documented 422 answers (computed from them, and sent
# by tests/api/test_openapi_examples.py).
INFEASIBLE_PLAN: dict[str, Any] = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "global_batch_size": 1000,
    "micro_batch_size": 32,
}
OUT_OF_RANGE_PLAN: dict[str, Any] = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "global_batch_size": -512,
}
