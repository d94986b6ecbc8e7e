"""Plan requests that Swagger shows (POST /v1/plans and the schedule request) and that tests
and benchmarks send: one copy, so the documented examples are the ones exercised.

Plain dicts, no pydantic: a benchmark's load generator imports them cheaply.
"""

from __future__ import annotations

import copy
from typing import Any


def _eight_gpu_nodes(num_nodes: int, **body: Any) -> dict[str, Any]:
    """A request body on `num_nodes` nodes of 8 GPUs, the cluster most examples plan for."""
    return {"topology": {"num_nodes": num_nodes, "gpus_per_node": 8}, **body}


def h100_and_a100(h100: dict[str, Any], a100: dict[str, Any], **body: Any) -> dict[str, Any]:
    """A request body on a cluster of an H100 group and an A100 group, each group's dict giving
    how its speed is known and, where it differs from the mixed examples' cluster (2 nodes of 8
    H100, 1 of 4 A100), its size."""
    return {
        "topology": {
            "node_groups": [
                {"name": "h100", "num_nodes": 2, "gpus_per_node": 8, **h100},
                {"name": "a100", "num_nodes": 1, "gpus_per_node": 4, **a100},
            ]
        },
        **body,
    }


def _curve(samples_per_s: dict[int, float]) -> list[dict[str, Any]]:
    """A throughput curve, from samples/s by micro-batch size."""
    return [{"micro_batch_size": m, "samples_per_s": s} for m, s in samples_per_s.items()]


def lr_scaling_result() -> dict[str, Any]:
    """An lr-scaling probe's answer at 512 from a 64-sample base run (sqrt's lr is 0.1 x sqrt(8)):
    the `measured_lr` example and LrScalingIn's. A fresh dict a call, so the two share none."""
    return {
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
    }


PLAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "homogeneous": {
        "summary": "16 GPUs, global batch 512",
        "value": _eight_gpu_nodes(2, global_batch_size=512),
    },
    "dataset_and_lr": {
        "summary": "ImageNet on 16 GPUs with a scaled learning rate and warmup",
        "value": _eight_gpu_nodes(
            2,
            global_batch_size=512,
            dataset={"num_samples": 1281167, "shuffle": True, "seed": 0, "drop_last": False, "epochs": 90},
            learning_rate={
                "base_lr": 0.1,
                "base_batch_size": 256,
                "rule": "linear",
                "optimizer": "sgd",
                "warmup_epochs": 5,
            },
        ),
    },
    "mixed": {
        "summary": "Mixed H100 and A100 nodes, split by throughput",
        "value": h100_and_a100(
            {"relative_throughput": 2.0, "max_micro_batch_size": 64},
            {"relative_throughput": 1.0, "max_micro_batch_size": 32},
            global_batch_size=1000,
            dataset={"num_samples": 100000},
        ),
    },
    "mixed_curves": {
        "summary": "Mixed H100 and A100 nodes, split by their measured throughput curves",
        "value": h100_and_a100(
            {
                "max_micro_batch_size": 64,
                "throughput_curve": _curve({8: 960.0, 16: 1840.0, 32: 2600.0, 64: 2700.0}),
            },
            {
                "max_micro_batch_size": 32,
                "throughput_curve": _curve({8: 520.0, 16: 880.0, 32: 1000.0}),
            },
            global_batch_size=1024,
            dataset={"num_samples": 100000},
        ),
    },
    "measured_lr": {
        "summary": "The lr scaled by the rule an lr-scaling probe measured best",
        "value": _eight_gpu_nodes(
            1,
            global_batch_size=512,
            learning_rate={
                "base_lr": 0.1,
                "base_batch_size": 64,
                "warmup_steps": 100,
                "train_steps": 2000,
                "rule": "measured",
                "lr_scaling": lr_scaling_result(),
            },
        ),
    },
    "megatron": {
        "summary": "Tensor and pipeline parallel, capped micro-batch, Adam",
        "value": _eight_gpu_nodes(
            4,
            parallelism={"tensor": 4, "pipeline": 2, "context": 1},
            global_batch_size=1024,
            max_micro_batch_size=16,
            learning_rate={
                "base_lr": 0.0003,
                "base_batch_size": 256,
                "optimizer": "adamw",
                "rule": "auto",
                "warmup_steps": 2000,
            },
        ),
    },
    "round_down": {
        "summary": "A batch that does not divide, moved to the nearest feasible value",
        "value": _eight_gpu_nodes(2, global_batch_size=1000, micro_batch_size=32, divisibility="round_down"),
    },
    "mesh_2d": {
        "summary": "A 2-D mesh: data parallel x tensor parallel (DDP replicas of TP pairs)",
        "value": _eight_gpu_nodes(2, parallelism={"tensor": 2}, global_batch_size=256),
    },
    "mesh_3d": {
        "summary": "A 3-D mesh: pipeline x FSDP x tensor parallel, the schedule's micro-batches accumulated",
        "value": _eight_gpu_nodes(
            4,
            parallelism={"tensor": 4, "pipeline": 2, "data_parallel_shard": 4},
            global_batch_size=256,
            micro_batch_size=8,
        ),
    },
    "noise_scale": {
        "summary": "A measured gradient noise scale: how efficient is this global batch?",
        "value": _eight_gpu_nodes(
            4, global_batch_size=1024, gradient_noise_scale=4096, gradient_noise_scale_stderr=300
        ),
    },
    "language_model": {
        "summary": "A language model planned in tokens, its loss normalised by tokens",
        "value": _eight_gpu_nodes(
            4,
            parallelism={"tensor": 2, "pipeline": 1, "context": 1},
            sequence_length=4096,
            global_batch_tokens=4194304,
            micro_batch_tokens=8192,
            loss_normalization="token",
            dataset={"num_samples": 2000000, "epochs": 1},
            learning_rate={
                "base_lr": 0.0003,
                "base_batch_tokens": 1048576,
                "optimizer": "adamw",
                "rule": "sqrt",
                # From lr / (warmup_steps + 1), the warmup torchtitan's scheduler runs: its export
                # is then exact (lr 0.0006 = 0.0003 x sqrt(4194304 / 1048576)).
                "warmup_steps": 99,
                "warmup_start_lr": 0.000006,
            },
        ),
    },
    "resume": {
        "summary": "Resumed from step 5,300 on 8 of the 16 GPUs: the same global batches, each rank's skip",
        "value": _eight_gpu_nodes(
            2,
            global_batch_size=512,
            max_micro_batch_size=64,
            dataset={"num_samples": 1280000, "shuffle": True, "seed": 0, "epochs": 90},
            learning_rate={
                "base_lr": 0.1,
                "base_batch_size": 256,
                "rule": "linear",
                "optimizer": "sgd",
                "warmup_epochs": 5,
                "decay": "cosine",
            },
            resume={"optimizer_step": 5300, "data_parallel_size": 8},
        ),
    },
    "packed_rows": {
        "summary": "Documents packed into rows: valid targets vary by rank, bounded and normalised",
        "value": _eight_gpu_nodes(
            4,
            parallelism={"tensor": 2, "pipeline": 1, "context": 1},
            sequence_length=4096,
            global_batch_tokens=4194304,
            micro_batch_tokens=8192,
            loss_normalization="token",
            packing={"mode": "rows", "document_length": {"mean": 900, "max": 2048}},
        ),
    },
    "token_budget": {
        "summary": "Micro-batches filled up to a token budget: unequal micro-batch counts per rank",
        "value": _eight_gpu_nodes(
            4,
            parallelism={"tensor": 2, "pipeline": 1, "context": 1},
            sequence_length=4096,
            global_batch_tokens=4194304,
            loss_normalization="token",
            packing={"mode": "token_budget", "max_tokens_per_micro_batch": 16384},
        ),
    },
    "scaling_law": {
        "summary": "No batch, no lr: Step Law's for a 1B model on 100B tokens, snapped to this cluster",
        "value": _eight_gpu_nodes(
            4,
            sequence_length=2048,
            recommend={
                "law": "step_law",
                "train_tokens": 100000000000,
                # Step Law's largest grid shape: N = 16 x (4 x 2048^2 + 3 x 2048 x 8192) = 1,073,741,824.
                "architecture": {"layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_heads": 16},
            },
        ),
    },
}


# A stream's plan, shown beside PLAN_EXAMPLES in Swagger (and replayed in the golden plans); apart
# from them because the exports that iterate PLAN_EXAMPLES do not write a stream.
STREAM_PLAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "stream": {
        "summary": "A streaming dataset (Hugging Face datasets) over 16 GPUs with 4 DataLoader workers each",
        "value": _eight_gpu_nodes(
            2,
            global_batch_size=512,
            micro_batch_size=8,
            dataset={
                "kind": "stream",
                "num_samples": 1000000,
                "num_shards": 1000,
                "splitter": "hf_datasets",
                "num_workers": 4,
                "end_of_epoch": "drop",
                "epochs": 3,
            },
            learning_rate={"base_lr": 0.0003, "base_batch_size": 256, "rule": "sqrt", "optimizer": "adamw"},
        ),
    },
}


def plan_example(name: str) -> dict[str, Any]:
    """The request body of `PLAN_EXAMPLES[name]`, a copy the caller may change."""
    return copy.deepcopy(PLAN_EXAMPLES[name]["value"])


# Requests the service refuses, for the documented 422 answers (computed from them, and sent
# by tests/api/test_openapi_examples.py).
INFEASIBLE_PLAN: dict[str, Any] = _eight_gpu_nodes(2, global_batch_size=1000, micro_batch_size=32)
OUT_OF_RANGE_PLAN: dict[str, Any] = _eight_gpu_nodes(2, global_batch_size=-512)
