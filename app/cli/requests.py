"""The plan request a command sends: built from the plan flags, or read from --request."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from app.cli.options import BatchFlags, PlanFlags
from app.cli.output import fail
from app.client import Json
from app.core.json_text import parse
from app.core.plan_types import LossNormalization


def node_group(text: str) -> Json:
    """One --node-group NAME:NODES:GPUS_PER_NODE[:THROUGHPUT[:CAP]] as the request's node group."""
    parts = text.split(":")
    if not 3 <= len(parts) <= 5:
        raise typer.BadParameter(
            f"{text!r}: expected NAME:NODES:GPUS_PER_NODE[:THROUGHPUT[:CAP]]", param_hint="--node-group"
        )
    group: Json = {}
    if parts[0]:
        group["name"] = parts[0]
    try:
        group["num_nodes"] = int(parts[1])
        group["gpus_per_node"] = int(parts[2])
        if len(parts) > 3 and parts[3]:
            throughput = float(parts[3])
            if not math.isfinite(throughput):
                raise ValueError(parts[3])
            group["relative_throughput"] = throughput
        if len(parts) > 4 and parts[4]:
            group["max_micro_batch_size"] = int(parts[4])
    except ValueError as err:
        raise typer.BadParameter(
            f"{text!r}: NODES, GPUS_PER_NODE and CAP are whole numbers, THROUGHPUT a finite number ({err})",
            param_hint="--node-group",
        ) from None
    return group


def plan_body(flags: BatchFlags) -> Json:
    """The plan request the flags describe (the topology defaults to one node of 8 GPUs)."""
    topology: Json = {}
    if flags.node_groups:
        topology["node_groups"] = [node_group(g) for g in flags.node_groups]
        # Both forms at once: left to the schema, which says so the same way here and on a server.
        topology.update(_given(flags, "num_nodes", "gpus_per_node"))
    else:
        topology["num_nodes"] = 1 if flags.num_nodes is None else flags.num_nodes
        topology["gpus_per_node"] = 8 if flags.gpus_per_node is None else flags.gpus_per_node
    body: Json = {
        "topology": topology,
        **_given(
            flags,
            "global_batch_size",
            "micro_batch_size",
            "gradient_accumulation_steps",
            "max_micro_batch_size",
            "sequence_length",
            "global_batch_tokens",
            "micro_batch_tokens",
        ),
        "divisibility": flags.divisibility.value,
        "loss_reduction": flags.loss_reduction.value,
        "parallelism": {"tensor": flags.tensor, "pipeline": flags.pipeline, "context": flags.context},
    }
    if (flags.data_parallel_shard, flags.expert) != (1, 1):
        body["parallelism"] |= {"data_parallel_shard": flags.data_parallel_shard, "expert": flags.expert}
    if flags.loss_normalization is not LossNormalization.SAMPLE:
        body["loss_normalization"] = flags.loss_normalization.value
    if flags.num_samples is not None:
        body["dataset"] = {
            "num_samples": flags.num_samples,
            "drop_last": flags.drop_last,
            "shuffle": flags.shuffle,
            "seed": flags.data_seed,
            **_given(flags, "epochs"),
        }
    if isinstance(flags, PlanFlags) and flags.base_lr is not None:
        body["learning_rate"] = {
            "base_lr": flags.base_lr,
            "base_batch_size": flags.base_batch_size,
            "rule": flags.rule.value,
            "optimizer": flags.optimizer.value,
            **_given(flags, "warmup_epochs", "warmup_steps", "base_batch_tokens", "warmup_start_lr"),
            **_given(flags, "min_lr", "train_steps", "momentum", "weight_decay", "max_grad_norm"),
            **({"decay": flags.decay.value} if flags.decay is not None else {}),
        }
    if isinstance(flags, PlanFlags):
        resume = {
            "optimizer_step": flags.resume_step,
            "consumed_samples": flags.resume_samples,
            "data_parallel_size": flags.resume_replicas,
        }
        if any(value is not None for value in resume.values()):
            body["resume"] = {k: v for k, v in resume.items() if v is not None}
    return body


def _given(flags: BatchFlags, *names: str) -> Json:
    """Those of the named flags that were given: the request leaves the others to the schema."""
    values = {name: getattr(flags, name) for name in names}
    return {name: value for name, value in values.items() if value is not None}


def read_json(path: Path) -> Any:
    """The file's JSON, read as the server reads a body (core.json_text)."""
    try:
        return parse(path.read_bytes())
    except OSError as err:
        fail({"detail": f"cannot read {path}: {err.strerror or err}"})
    except json.JSONDecodeError as err:
        fail({"detail": f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"})


def plan_request(request: Path | None, flags: BatchFlags) -> Json:
    """The --request file's plan request when given, else the one the flags describe."""
    if request is None:
        return plan_body(flags)
    data = read_json(request)
    if not isinstance(data, dict):
        fail({"detail": f"{request} must hold a JSON object (a plan request)"})
    return data
