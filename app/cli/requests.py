"""The plan request a command sends: built from the plan flags, or read from --request."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from app.cli.errors import fail
from app.cli.options import BatchFlags, PlanFlags
from app.client import Json
from app.core.records.plan_request import LossNormalization, LRRule
from app.core.request.json_text import parse


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


def curve_points(text: str) -> tuple[str | None, list[Json]]:
    """One --throughput-curve [GROUP=]MICRO:RATE,... as (group name or None, the curve's points);
    the planner checks the numbers, as it does a request's."""
    name, _, pairs = text.rpartition("=")
    points: list[Json] = []
    try:
        for pair in pairs.split(","):
            micro, _, rate = pair.partition(":")
            points.append({"micro_batch_size": int(micro), "samples_per_s": float(rate)})
    except ValueError as err:
        raise typer.BadParameter(
            f"{text!r}: expected [GROUP=]MICRO:SAMPLES_PER_S,... (e.g. 8:960,16:1840), MICRO a whole "
            f"number and SAMPLES_PER_S a number ({err})",
            param_hint="--throughput-curve",
        ) from None
    return name or None, points


def _with_curves(topology: Json, curves: list[str]) -> None:
    groups = topology.get("node_groups")
    for text in curves:
        name, points = curve_points(text)
        if groups is None:
            if name is not None:
                raise typer.BadParameter(
                    f"{text!r}: a GROUP= curve needs --node-group; without node groups give "
                    f"MICRO:SAMPLES_PER_S,... alone",
                    param_hint="--throughput-curve",
                )
            topology["throughput_curve"] = points
            continue
        names = [g.get("name") or f"group{i}" for i, g in enumerate(groups)]
        if name not in names:
            raise typer.BadParameter(
                f"{text!r}: with --node-group, name the group (NAME=MICRO:RATE,...): one of "
                + ", ".join(names),
                param_hint="--throughput-curve",
            )
        groups[names.index(name)]["throughput_curve"] = points


def _measured_lr(flags: PlanFlags, lr: Json) -> None:
    """--lr-scaling-result or --lr-scaling-check: the probe's numbers, or its id for a server."""
    if flags.lr_scaling_result is None and flags.lr_scaling_check is None:
        return
    if flags.rule is LRRule.AUTO:  # a measurement given is the rule asked for
        lr["rule"] = LRRule.MEASURED.value
    if flags.lr_scaling_check is not None:
        lr["lr_scaling_check"] = flags.lr_scaling_check
    if flags.lr_scaling_result is not None:
        data = read_json(flags.lr_scaling_result)
        for key in ("result", "lr_scaling"):  # a check as GET /v1/checks/ID answers it, or its result
            if isinstance(data, dict) and isinstance(data.get(key), dict):
                data = data[key]
        lr["lr_scaling"] = data


# The recipe's flags sent as they are, when given.
_RECIPE_FLAGS = ("min_lr", "train_steps", "train_samples", "momentum", "weight_decay", "max_grad_norm")


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
    if flags.throughput_curves:
        _with_curves(topology, flags.throughput_curves)
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
    if flags.num_samples is not None or flags.stream:
        body["dataset"] = _dataset(flags)
    if isinstance(flags, PlanFlags) and flags.base_lr is not None:
        body["learning_rate"] = {
            "base_lr": flags.base_lr,
            "base_batch_size": flags.base_batch_size,
            "rule": flags.rule.value,
            "optimizer": flags.optimizer.value,
            **_given(flags, "warmup_epochs", "warmup_steps", "base_batch_tokens", "warmup_start_lr"),
            **_given(flags, *_RECIPE_FLAGS),
            **({"decay": flags.decay.value} if flags.decay is not None else {}),
        }
        _measured_lr(flags, body["learning_rate"])
    if isinstance(flags, PlanFlags):
        resume = {
            "optimizer_step": flags.resume_step,
            "consumed_samples": flags.resume_samples,
            "data_parallel_size": flags.resume_replicas,
        }
        if any(value is not None for value in resume.values()):
            body["resume"] = {k: v for k, v in resume.items() if v is not None}
    return body


def _dataset(flags: BatchFlags) -> Json:
    """The request's dataset: a map-style one, or with --stream a stream (its fields as given;
    the service refuses a missing one at its field)."""
    dataset: Json = {"seed": flags.data_seed, **_given(flags, "num_samples", "shuffle", "epochs")}
    if not flags.stream:
        return {**dataset, "drop_last": flags.drop_last}
    listed = _counts(flags.shard_samples) if flags.shard_samples is not None else None
    stream = _given(flags, "num_shards", "splitter", "num_workers", "end_of_epoch")
    return {"kind": "stream", **dataset, **stream, **({"shard_samples": listed} if listed else {})} | (
        {"drop_last": True} if flags.drop_last else {}
    )


def _counts(text: str) -> list[int]:
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        fail({"detail": f"--shard-samples takes whole numbers and commas (e.g. 300,200,100), not {text!r}"})


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
