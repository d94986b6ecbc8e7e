"""Plans written out in the formats people paste into their launchers and trainers.

Each export is one pure function `(ExportInput) -> Export` registered in `EXPORTERS`; a new
format is one function and one line there. Standard library only: YAML is emitted by hand
(every string double-quoted, JSON-style, which YAML reads the same; floats always with a
decimal point, because YAML 1.1 reads `1e-08` as a string) and the tests parse it with PyYAML.

Uneven (proportional) plans give replicas different micro-batches. DeepSpeed, the HF
Trainer, Lightning and Accelerate take one per-device batch size, so writing such a plan in
their formats would silently run a different, biased split: those exports refuse it with a
422 (`ExportUnsupported`) that names the nearest even alternative. Launchers (torchrun,
Slurm) and the Python skeleton carry the per-rank table.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.core.errors import PlanError
from app.core.models import Divisibility, Plan, PlanRequest
from app.core.planner import plan as run_plan

# ----------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class ExportOptions:
    script: str = "train.py"  # what torchrun starts on every node
    job_name: str = "batchplan"  # Slurm job name, PyTorchJob metadata.name (RFC 1123)
    image: str = "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
    port: int = 29500  # rendezvous / master port


@dataclass(frozen=True, slots=True)
class ExportInput:
    request: PlanRequest
    plan: Plan
    options: ExportOptions = ExportOptions()


@dataclass(frozen=True, slots=True)
class Export:
    format: str
    media_type: str
    filename: str
    text: str


@dataclass(eq=False)
class ExportUnsupported(PlanError):
    """The plan is valid but this format cannot express it."""

    slug: str = "export-unsupported"
    title: str = "This plan cannot be written in the requested format"


Exporter = Callable[[ExportInput], Export]

# ----------------------------------------------------------------------------- helpers


def _yaml_string(text: str) -> str:
    """A YAML double-quoted scalar that stays printable ASCII: YAML escapes, one per
    character (JSON's surrogate pairs for astral characters are not YAML)."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if not math.isfinite(value):
            raise ValueError(f"no YAML for {value!r}")
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        # YAML 1.1 (PyYAML) wants a signed exponent: 1.0e+20, not 1.0e20.
        if exponent and exponent[0] not in "+-":
            exponent = "+" + exponent
        return mantissa + ("e" + exponent if exponent else "")
    if isinstance(value, str):
        return _yaml_string(value)
    raise TypeError(f"no YAML for {type(value).__name__}")


# Words YAML 1.1 reads as booleans or null: as plain keys they would not stay strings.
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _plain_key(key: str) -> bool:
    simple = key[:1].isascii() and key[:1].isalpha()
    simple = simple and all(c.isascii() and (c.isalnum() or c in "_./-") for c in key)
    return simple and key.lower() not in _YAML_WORDS


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists and scalars; keys are plain identifiers or quoted."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = key if _plain_key(key) else _yaml_string(key)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{name}:")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{name}: {_flow(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                body = to_yaml(item, indent + 2).splitlines()
                lines.append(f"{pad}- {body[0].lstrip()}")
                lines.extend(body[1:])
            elif isinstance(item, list) and item:
                lines.append(f"{pad}-")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}- {_flow(item)}")
    else:
        lines.append(pad + _yaml_scalar(value))
    return "\n".join(lines)


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)


def _comment(lines: list[str], mark: str = "#") -> str:
    return "\n".join(f"{mark} {line}".rstrip() for line in lines)


def _summary(x: ExportInput) -> list[str]:
    p = x.plan
    lines = [
        f"batchplan: {p.world_size} GPUs, data-parallel size {p.data_parallel_size}"
        + (f" (model-parallel {p.model_parallel_size})" if p.model_parallel_size > 1 else ""),
    ]
    if p.micro_batch_size is not None:
        lines.append(
            f"global batch {p.global_batch_size} = micro-batch {p.micro_batch_size} x accumulation "
            f"{p.gradient_accumulation_steps} x {p.data_parallel_size} replicas"
        )
    else:
        lines.append(
            f"global batch {p.global_batch_size}, accumulation {p.gradient_accumulation_steps}, "
            f"uneven micro-batches per replica group:"
        )
        for g in p.replica_groups:
            lines.append(
                f"  ranks {g.start}-{g.stop - 1} ({g.node_group}): micro-batch {g.micro_batch_size}, "
                f"loss scale {g.loss_scale!r}"
            )
    if p.learning_rate is not None:
        lr = p.learning_rate
        lines.append(
            f"learning rate {lr.lr!r} ({lr.rule} rule from {lr.base_lr!r} per {lr.base_batch_size}), "
            f"warmup {lr.warmup_steps} steps from {lr.warmup_start_lr!r}"
        )
    lines += [f"warning: {w}" for w in p.warnings]
    return lines


@dataclass(frozen=True, slots=True)
class _NodeGroup:
    name: str
    num_nodes: int
    gpus_per_node: int
    first_node: int


def _node_groups(x: ExportInput) -> list[_NodeGroup]:
    out, node = [], 0
    for g in x.request.topology.node_groups:
        out.append(_NodeGroup(g.name, g.num_nodes, g.gpus_per_node, node))
        node += g.num_nodes
    return out


def _num_nodes(x: ExportInput) -> int:
    return sum(g.num_nodes for g in x.request.topology.node_groups)


def _uniform_gpus_per_node(x: ExportInput) -> int | None:
    shapes = {g.gpus_per_node for g in x.request.topology.node_groups}
    return shapes.pop() if len(shapes) == 1 else None


def _pinned_ranks(x: ExportInput) -> bool:
    """True when a rank's share depends on which node it runs on: the launch must then
    number nodes in node-group order (static rendezvous), not in c10d's join order."""
    return x.plan.split == "proportional" and len(x.request.topology.node_groups) > 1


def _even_alternative(x: ExportInput) -> dict[str, list[int]]:
    """Nearest global batches an even split can run on this cluster, each checked by the
    planner with an explicit micro-batch (which makes the split even)."""
    p, request = x.plan, x.request
    dp = p.data_parallel_size
    caps = [g.max_micro_batch_size for g in p.replica_groups if g.max_micro_batch_size is not None]
    cap = min(caps) if caps else None
    found: dict[int, int] = {}
    base = p.global_batch_size // dp
    for per_replica in sorted({max(base, 1), base + 1}):
        accumulation = next(
            (
                a
                for a in range(1, per_replica + 1)
                if per_replica % a == 0 and (cap is None or per_replica // a <= cap)
            ),
            None,
        )
        if accumulation is None:
            continue
        micro = per_replica // accumulation
        try:
            candidate = run_plan(
                replace(
                    request,
                    global_batch_size=per_replica * dp,
                    micro_batch_size=micro,
                    gradient_accumulation_steps=None,
                    divisibility=Divisibility.EXACT,
                )
            )
        except PlanError:
            continue
        if candidate.split == "even":
            found[candidate.global_batch_size] = micro
    ordered = sorted(found, key=lambda v: (abs(v - p.global_batch_size), v))
    return {"global_batch_size": ordered, "micro_batch_size": [found[v] for v in ordered]} if ordered else {}


def _require_even(x: ExportInput, fmt: str, why: str) -> None:
    if x.plan.micro_batch_size is not None:
        return
    suggestions = _even_alternative(x)
    alternative = ""
    if suggestions:
        alternative = (
            f"; the nearest even split is global_batch_size {suggestions['global_batch_size'][0]} with "
            f"micro_batch_size {suggestions['micro_batch_size'][0]} (faster GPUs then wait for slower ones)"
        )
    raise ExportUnsupported(
        f"this plan gives replicas different micro-batches "
        f"({', '.join(str(g.micro_batch_size) for g in x.plan.replica_groups)}), and {fmt} {why}, "
        f"so it would run a different, unevenly weighted batch{alternative}. Use the python or torchrun "
        f"export for the uneven split",
        pointer="/divisibility"
        if x.request.divisibility is Divisibility.BALANCE
        else "/topology/node_groups",
        suggestions=suggestions,
    )


def _require_uniform_nodes(x: ExportInput, fmt: str) -> int:
    shape = _uniform_gpus_per_node(x)
    if shape is None:
        raise ExportUnsupported(
            f"{fmt} runs the same number of processes on every node, and these node groups have "
            f"{sorted({g.gpus_per_node for g in x.request.topology.node_groups})} GPUs per node; "
            f"use the torchrun or slurm export",
            pointer="/topology/node_groups",
        )
    return shape


def _lr_values(x: ExportInput) -> tuple[float | None, int, float | None]:
    lr = x.plan.learning_rate
    return (lr.lr, lr.warmup_steps, lr.warmup_start_lr) if lr else (None, 0, None)


# ----------------------------------------------------------------------------- torchrun / slurm


def _torchrun_args(x: ExportInput, *, nnodes: str, nproc: str, rendezvous: list[str]) -> list[str]:
    return [
        "torchrun",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        nproc,
        *rendezvous,
        x.options.script,
    ]


def _line(args: list[str], indent: str = "") -> str:
    """A shell command, one option per line. Words starting with `"$` are already quoted
    shell expressions; everything else is quoted for the shell."""
    words = [a if a.startswith('"$') else shlex.quote(a) for a in args]
    parts, i = [words[0]], 1
    while i < len(words):
        if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
            parts.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            parts.append(words[i])
            i += 1
    return (" \\\n" + indent + "  ").join(parts)


def _batch_env(x: ExportInput) -> list[str]:
    p = x.plan
    if p.micro_batch_size is None:
        return ["# Per-rank micro-batches differ: the training script reads them from its replica table."]
    return [
        f"export GLOBAL_BATCH_SIZE={p.global_batch_size} MICRO_BATCH_SIZE={p.micro_batch_size} "
        f"GRADIENT_ACCUMULATION_STEPS={p.gradient_accumulation_steps}"
    ]


def export_torchrun(x: ExportInput) -> Export:
    port = x.options.port
    groups = _node_groups(x)
    nodes = _num_nodes(x)
    shape = _uniform_gpus_per_node(x)
    head = ["#!/usr/bin/env bash", _comment(_summary(x)), "set -euo pipefail", *_batch_env(x)]
    if nodes == 1:
        body = [
            "# Single node: every GPU of this machine, rendezvous on localhost.",
            _line(
                _torchrun_args(x, nnodes="1", nproc=str(groups[0].gpus_per_node), rendezvous=["--standalone"])
            ),
        ]
    elif not _pinned_ranks(x):
        nproc = str(shape) if shape is not None else "gpu"
        body = [
            f"# Multi-node: run this same script on each of the {nodes} nodes. The c10d rendezvous",
            "# numbers the nodes as they join; MASTER_ADDR is any one node, the same everywhere.",
        ]
        if shape is None:
            body.append("# Node groups differ in GPUs per node: each node starts one process per local GPU.")
        body += [
            ': "${MASTER_ADDR:?set MASTER_ADDR to the address of one node, the same on every node}"',
            f'MASTER_PORT="${{MASTER_PORT:-{port}}}"',
            _line(
                _torchrun_args(
                    x,
                    nnodes=str(nodes),
                    nproc=nproc,
                    rendezvous=[
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        '"$MASTER_ADDR:$MASTER_PORT"',
                        "--rdzv-id",
                        '"${RDZV_ID:-batchplan}"',
                    ],
                )
            ),
        ]
    else:
        body = [
            f"# Multi-node with uneven shares: run this script on each of the {nodes} nodes with",
            "# NODE_RANK set. Ranks are numbered in node-group order, so each node's GPUs get the",
            "# micro-batch planned for them; static rendezvous keeps that order (c10d would number",
            "# nodes as they join).",
        ]
        for g in groups:
            body.append(f"#   NODE_RANK {g.first_node}-{g.first_node + g.num_nodes - 1}: {g.name} nodes")
        body += [
            ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the node with NODE_RANK 0}"',
            ': "${NODE_RANK:?set NODE_RANK to this node index, in node-group order}"',
            f'MASTER_PORT="${{MASTER_PORT:-{port}}}"',
        ]
        for i, g in enumerate(groups):
            keyword = "if" if i == 0 else "elif"
            body.append(
                f'{keyword} [ "$NODE_RANK" -lt {g.first_node + g.num_nodes} ]; then NPROC={g.gpus_per_node}'
            )
        body += [
            f'else echo "NODE_RANK must be below {nodes}" >&2; exit 2; fi',
            _line(
                _torchrun_args(
                    x,
                    nnodes=str(nodes),
                    nproc='"$NPROC"',
                    rendezvous=[
                        "--node-rank",
                        '"$NODE_RANK"',
                        "--master-addr",
                        '"$MASTER_ADDR"',
                        "--master-port",
                        '"$MASTER_PORT"',
                    ],
                )
            ),
        ]
    return Export("torchrun", "text/plain", "launch.sh", "\n".join(head + body) + "\n")


def export_slurm(x: ExportInput) -> Export:
    port = x.options.port
    groups = _node_groups(x)
    shape = _uniform_gpus_per_node(x)
    het = shape is None or _pinned_ranks(x)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={shlex.quote(x.options.job_name)}"]
    if not het:
        lines += [
            f"#SBATCH --nodes={_num_nodes(x)}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={shape}",
        ]
    else:
        for i, g in enumerate(groups):
            if i:
                lines.append("#SBATCH hetjob")
            lines += [
                f"#SBATCH --nodes={g.num_nodes}",
                "#SBATCH --ntasks-per-node=1",
                f"#SBATCH --gpus-per-node={g.gpus_per_node}",
                f"# component {i}: {g.name} nodes (add --constraint or --partition to place them)",
            ]
    lines += [
        "#SBATCH --output=%x-%j.out",
        _comment(_summary(x)),
        "# One task per node runs torchrun, which starts one process per GPU.",
        "set -euo pipefail",
        *_batch_env(x),
        f"MASTER_PORT={port}",
    ]
    if not het:
        lines += [
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_ADDR MASTER_PORT",
            "srun --kill-on-bad-exit=1 "
            + _line(
                _torchrun_args(
                    x,
                    nnodes='"$SLURM_NNODES"',
                    nproc=str(shape),
                    rendezvous=[
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        '"$MASTER_ADDR:$MASTER_PORT"',
                        "--rdzv-id",
                        '"$SLURM_JOB_ID"',
                    ],
                )
            ),
        ]
    else:
        # A heterogeneous step numbers its tasks across components in order, one task per
        # node here, so SLURM_PROCID is the node rank in node-group order. It is read inside
        # each task (single quotes), not when the batch script runs.
        lines += [
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n 1)"',
            "export MASTER_ADDR MASTER_PORT",
        ]
        steps = []
        for i, g in enumerate(groups):
            inner = " ".join(
                [
                    "exec torchrun",
                    f"--nnodes {_num_nodes(x)}",
                    f"--nproc-per-node {g.gpus_per_node}",
                    '--node-rank "$SLURM_PROCID"',
                    '--master-addr "$MASTER_ADDR"',
                    '--master-port "$MASTER_PORT"',
                    shlex.quote(x.options.script),
                ]
            )
            steps.append(f"--het-group={i} bash -c {shlex.quote(inner)}")
        lines.append("srun --kill-on-bad-exit=1 " + " \\\n  : ".join(steps))
    return Export("slurm", "text/plain", "job.sbatch", "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- kubernetes


def export_kubernetes(x: ExportInput) -> Export:
    shape = _require_uniform_nodes(x, "a PyTorchJob (one nprocPerNode for all pods)")
    if _pinned_ranks(x):
        raise ExportUnsupported(
            "this plan gives each node group its own micro-batch, and a PyTorchJob cannot pin worker "
            "indices to node types; use the slurm or torchrun export, or an even split",
            pointer="/topology/node_groups",
            suggestions=_even_alternative(x),
        )
    nodes = _num_nodes(x)
    env = []
    if x.plan.micro_batch_size is not None:
        env = [
            {"name": "GLOBAL_BATCH_SIZE", "value": str(x.plan.global_batch_size)},
            {"name": "MICRO_BATCH_SIZE", "value": str(x.plan.micro_batch_size)},
            {"name": "GRADIENT_ACCUMULATION_STEPS", "value": str(x.plan.gradient_accumulation_steps)},
        ]

    def replica(count: int) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "pytorch",  # the training operator looks for this container name
            "image": x.options.image,
            # The operator sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT,
            # which torchrun reads as defaults.
            "command": ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(shape), x.options.script],
            "resources": {"limits": {"nvidia.com/gpu": shape}},
        }
        if env:
            container["env"] = env
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": x.options.job_name},
        "spec": {"nprocPerNode": str(shape), "pytorchReplicaSpecs": specs},
    }
    text = _comment(_summary(x)) + "\n" + to_yaml(manifest) + "\n"
    return Export("kubernetes", "application/yaml", "pytorchjob.yaml", text)


# ----------------------------------------------------------------------------- deepspeed

_DEEPSPEED_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "lamb": "Lamb"}


def deepspeed_config(x: ExportInput) -> dict[str, Any]:
    _require_even(x, "DeepSpeed", "takes one train_micro_batch_size_per_gpu for every rank")
    p = x.plan
    assert p.micro_batch_size is not None
    # DeepSpeed's rule: train_batch_size == micro x accumulation x data-parallel world size.
    config: dict[str, Any] = {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    lr = p.learning_rate
    if lr is not None and lr.optimizer in _DEEPSPEED_OPTIMIZERS:
        params: dict[str, Any] = {"lr": lr.lr}
        if lr.adam is not None and lr.adam.valid:
            params |= {"betas": [lr.adam.beta1, lr.adam.beta2], "eps": lr.adam.eps}
        config["optimizer"] = {"type": _DEEPSPEED_OPTIMIZERS[lr.optimizer], "params": params}
    if lr is not None and lr.warmup_steps > 0:
        total = p.sampler.total_optimizer_steps if p.sampler else None
        sched: dict[str, Any] = {
            "warmup_min_lr": lr.warmup_start_lr,
            "warmup_max_lr": lr.lr,
            "warmup_num_steps": lr.warmup_steps,
            # DeepSpeed's default warmup is logarithmic; the plan's is linear.
            "warmup_type": "linear",
        }
        if total is not None and total > lr.warmup_steps:
            sched["total_num_steps"] = total
        config["scheduler"] = {
            "type": "WarmupDecayLR" if "total_num_steps" in sched else "WarmupLR",
            "params": sched,
        }
    return config


def export_deepspeed(x: ExportInput) -> Export:
    return Export(
        "deepspeed", "application/json", "ds_config.json", json.dumps(deepspeed_config(x), indent=2) + "\n"
    )


# ----------------------------------------------------------------------------- accelerate / HF / Lightning


def export_accelerate(x: ExportInput) -> Export:
    _require_even(x, "Accelerate", "gives every process the same DataLoader batch size")
    shape = _require_uniform_nodes(x, "Accelerate")
    p, nodes = x.plan, _num_nodes(x)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "num_machines": nodes,
        "num_processes": nodes * shape,  # all processes, not per machine
        "machine_rank": 0,
        "gpu_ids": "all",
        "mixed_precision": "no",
        "use_cpu": False,
        "downcast_bf16": "no",
    }
    if nodes > 1:
        config |= {
            "main_process_ip": "MASTER_ADDR",
            "main_process_port": x.options.port,
            "rdzv_backend": "static",
            "same_network": True,
        }
    lr, warmup, _ = _lr_values(x)
    code = [
        "In the training script:",
        f"  accelerator = Accelerator(gradient_accumulation_steps={p.gradient_accumulation_steps})",
        f"  loader = DataLoader(dataset, batch_size={p.micro_batch_size}, shuffle=True)  # per process",
        "  model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)",
        "  with accelerator.accumulate(model): ... accelerator.backward(loss)  # divides by the accumulation",
    ]
    if lr is not None:
        code.append(f"  optimizer lr = {lr!r}, warmup {warmup} optimizer steps")
    if nodes > 1:
        code.append("Set main_process_ip to node 0's address and machine_rank to each node's index.")
    text = _comment(_summary(x) + code) + "\n" + to_yaml(config) + "\n"
    return Export("accelerate", "application/yaml", "accelerate_config.yaml", text)


def _kwargs(call: str, values: dict[str, Any], notes: dict[str, str]) -> str:
    lines = [f"{call}("]
    for key, value in values.items():
        note = f"  # {notes[key]}" if key in notes else ""
        lines.append(f"    {key}={value!r},{note}")
    lines.append(")")
    return "\n".join(lines)


def training_arguments(x: ExportInput) -> dict[str, Any]:
    _require_even(x, "the HF Trainer", "takes one per_device_train_batch_size")
    p = x.plan
    values: dict[str, Any] = {
        "output_dir": x.options.job_name,
        "per_device_train_batch_size": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    lr, warmup, _ = _lr_values(x)
    if lr is not None:
        values |= {"learning_rate": lr, "warmup_steps": warmup, "lr_scheduler_type": "linear"}
    if p.sampler is not None:
        values |= {"dataloader_drop_last": p.sampler.drop_last, "seed": p.sampler.seed}
        if p.sampler.epochs is not None:
            values["num_train_epochs"] = p.sampler.epochs
    return values


def export_hf_trainer(x: ExportInput) -> Export:
    values = training_arguments(x)
    notes = {
        "per_device_train_batch_size": f"x {x.plan.gradient_accumulation_steps} accumulation x "
        f"{x.plan.data_parallel_size} processes = {x.plan.global_batch_size}",
    }
    lr = x.plan.learning_rate
    if lr is not None:
        notes["warmup_steps"] = f"the Trainer warms up from 0, not from {lr.warmup_start_lr!r}"
    text = "\n".join(
        [
            _comment(_summary(x)),
            "# Launch with torchrun (see the torchrun export); the Trainer reads the world size from it.",
            "from transformers import TrainingArguments",
            "",
            _kwargs("training_args = TrainingArguments", values, notes),
            "",
        ]
    )
    return Export("hf-trainer", "text/plain", "training_args.py", text)


def export_lightning(x: ExportInput) -> Export:
    _require_even(x, "Lightning", "gives every process the same DataLoader batch size")
    shape = _require_uniform_nodes(x, "Lightning")
    p = x.plan
    trainer: dict[str, Any] = {
        "accelerator": "gpu",
        "devices": shape,
        "num_nodes": _num_nodes(x),
        "strategy": "ddp",
        "accumulate_grad_batches": p.gradient_accumulation_steps,
        "use_distributed_sampler": True,
    }
    if p.sampler is not None and p.sampler.epochs is not None:
        trainer["max_epochs"] = p.sampler.epochs
    loader = {"batch_size": p.micro_batch_size, "shuffle": p.sampler.shuffle if p.sampler else True}
    lr, warmup, start = _lr_values(x)
    lines = [
        _comment(_summary(x)),
        "# Lightning swaps in a DistributedSampler and divides the loss by accumulate_grad_batches.",
        "import lightning as L",
        "from torch.utils.data import DataLoader",
        "",
        _kwargs("trainer = L.Trainer", trainer, {}),
        _kwargs(
            "train_loader = DataLoader", {"dataset": None, **loader}, {"dataset": "your Dataset"}
        ).replace("dataset=None", "dataset=train_dataset"),
    ]
    if lr is not None:
        lines.append(
            f"# configure_optimizers: lr={lr!r}, linear warmup from {start!r} over {warmup} optimizer steps"
        )
    return Export("lightning", "text/plain", "lightning_trainer.py", "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- python skeleton

_SKELETON = '''#!/usr/bin/env python3
"""DDP training loop for a batchplan plan.

__SUMMARY__

Launch one process per GPU with torchrun (see the torchrun export for multi-node), e.g.
    torchrun --nproc-per-node __NPROC__ __SCRIPT__
Replace build_dataset() and build_model(). To try the loop first on CPU with a toy model and
data set (gloo backend): BATCHPLAN_TOY=1 torchrun --nproc-per-node __WORLD__ __SCRIPT__ --max-steps 2
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset
__SAMPLER_IMPORT__
# ---- the plan: change it by planning again, not by hand --------------------------------
DATA_PARALLEL_SIZE = __WORLD__  # processes; the loop refuses to run with any other number
GLOBAL_BATCH_SIZE = __GLOBAL__
GRADIENT_ACCUMULATION_STEPS = __ACCUM__
EVEN_SPLIT = __EVEN__
# (first rank, stop rank, micro-batch size, loss scale) for data-parallel ranks [first, stop)
REPLICA_GROUPS = __GROUPS__
LOSS_REDUCTION = __REDUCTION__
SHUFFLE, SEED, DROP_LAST = __SHUFFLE__, __SEED__, __DROP_LAST__
EPOCHS = __EPOCHS__
OPTIMIZER = __OPTIMIZER__
LR, WARMUP_START_LR, WARMUP_STEPS = __LR__, __WARMUP_START__, __WARMUP__
ADAM_BETAS, ADAM_EPS = __BETAS__, __EPS__

TOY = os.environ.get("BATCHPLAN_TOY") == "1"


def build_dataset() -> Dataset:
    if TOY:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4 * GLOBAL_BATCH_SIZE, 8, generator=generator)
        y = x @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(len(x), 1, generator=generator)
        return TensorDataset(x, y)
    raise NotImplementedError("build_dataset(): return your training Dataset (or set BATCHPLAN_TOY=1)")


def build_model() -> nn.Module:
    if TOY:
        return nn.Linear(8, 1)
    raise NotImplementedError("build_model(): return your model (or set BATCHPLAN_TOY=1)")


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # The plan's loss scales assume this reduction.
    return nn.functional.mse_loss(output, target, reduction=LOSS_REDUCTION)


def replica_settings(rank: int) -> tuple[int, float]:
    for first, stop, micro, scale in REPLICA_GROUPS:
        if first <= rank < stop:
            return micro, scale
    raise ValueError(f"rank {rank} is in no replica group")


def make_sampler(dataset: Dataset, rank: int):
    if EVEN_SPLIT:
        return DistributedSampler(
            dataset, num_replicas=DATA_PARALLEL_SIZE, rank=rank, shuffle=SHUFFLE, seed=SEED,
            drop_last=DROP_LAST,
        )
    # Each micro-step's samples are shared out by micro-batch size, rank by rank.
    micro_batch_sizes = [micro for first, stop, micro, _ in REPLICA_GROUPS for _ in range(first, stop)]
    return ProportionalSampler(
        len(dataset), micro_batch_sizes, rank, shuffle=SHUFFLE, seed=SEED, drop_last=DROP_LAST
    )


def build_optimizer(params) -> torch.optim.Optimizer:
    if OPTIMIZER in ("adam", "adamw", "lamb"):  # torch has no LAMB: AdamW stands in, plug in yours
        cls = torch.optim.Adam if OPTIMIZER == "adam" else torch.optim.AdamW
        return cls(params, lr=LR, betas=ADAM_BETAS, eps=ADAM_EPS)
    return torch.optim.SGD(params, lr=LR, momentum=0.9)  # torch has no LARS: plug in yours


def warmup_factor(step: int) -> float:
    """Linear warmup from WARMUP_START_LR to LR over WARMUP_STEPS optimizer steps."""
    if step >= WARMUP_STEPS:
        return 1.0
    return (WARMUP_START_LR + (LR - WARMUP_START_LR) * step / WARMUP_STEPS) / LR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps")
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != DATA_PARALLEL_SIZE:
        raise SystemExit(
            f"this plan is for {DATA_PARALLEL_SIZE} processes, not {world}: the global batch and the "
            f"loss scales depend on it; plan again for {world}"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    micro_batch_size, loss_scale = replica_settings(rank)

    torch.manual_seed(SEED)  # DDP also broadcasts rank 0's weights at construction
    model = DDP(build_model().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    dataset = build_dataset()
    sampler = make_sampler(dataset, rank)
    # The sampler owns drop_last; the DataLoader keeps every index it is given.
    loader = DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, drop_last=False)
    optimizer = build_optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_factor)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first order
        optimizer.zero_grad(set_to_none=True)
        # Micro-batches past the last whole optimizer step are skipped: under no_sync their
        # gradients would stay local and leak, unscaled, into the next epoch's first step.
        usable = len(loader) // GRADIENT_ACCUMULATION_STEPS * GRADIENT_ACCUMULATION_STEPS
        for i, (inputs, targets) in enumerate(loader):
            if i >= usable:
                break
            inputs, targets = inputs.to(device), targets.to(device)
            sync = (i + 1) % GRADIENT_ACCUMULATION_STEPS == 0
            # Only the last micro-batch of a step all-reduces; the others accumulate locally.
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = loss_fn(model(inputs), targets)
                # loss_scale makes the accumulated, DDP-averaged gradient that of the mean loss
                # over the global batch (1 / accumulation on an even split).
                (loss * loss_scale).backward()
            if not sync:
                continue
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and (step == 1 or step % args.log_every == 0):
                print(f"epoch {epoch} step {step} loss {loss.item():.6g} lr {scheduler.get_last_lr()[0]:.6g}",
                      flush=True)
            if args.max_steps and step >= args.max_steps:
                break
        if args.max_steps and step >= args.max_steps:
            break
    if rank == 0:
        print(f"done: {step} optimizer steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def export_python(x: ExportInput) -> Export:
    p = x.plan
    if p.model_parallel_size > 1:
        raise ExportUnsupported(
            f"the python skeleton is plain DDP (data-parallel only), and this plan has model-parallel "
            f"size {p.model_parallel_size}; use the deepspeed or torchrun export with your "
            f"model-parallel framework",
            pointer="/parallelism",
            suggestions={"tensor": [1], "pipeline": [1], "context": [1]},
        )
    lr = p.learning_rate
    groups = [(g.start, g.stop, g.micro_batch_size, g.loss_scale) for g in p.replica_groups]
    betas = (lr.adam.beta1, lr.adam.beta2) if lr and lr.adam and lr.adam.valid else (0.9, 0.999)
    eps = lr.adam.eps if lr and lr.adam and lr.adam.valid else 1e-8
    sampler_import = (
        ""
        if p.split == "even"
        else "\nfrom app.worker.samplers import ProportionalSampler  # pip install batchplan\n"
    )
    shape = _uniform_gpus_per_node(x)
    fields = {
        "__SUMMARY__": "\n".join(_summary(x)).replace('"""', "'''").replace("\\", "\\\\"),
        "__NPROC__": str(shape if shape is not None else "gpu"),
        "__SCRIPT__": x.options.script,
        "__SAMPLER_IMPORT__": sampler_import,
        "__WORLD__": str(p.data_parallel_size),
        "__GLOBAL__": str(p.global_batch_size),
        "__ACCUM__": str(p.gradient_accumulation_steps),
        "__EVEN__": repr(p.split == "even"),
        "__GROUPS__": repr(groups),
        "__REDUCTION__": repr(p.loss_reduction),
        "__SHUFFLE__": repr(p.sampler.shuffle if p.sampler else True),
        "__SEED__": repr(p.sampler.seed if p.sampler else 0),
        "__DROP_LAST__": repr(p.sampler.drop_last if p.sampler else False),
        "__EPOCHS__": repr(p.sampler.epochs if p.sampler and p.sampler.epochs else 1),
        "__OPTIMIZER__": repr(lr.optimizer if lr else "sgd"),
        "__LR__": repr(lr.lr if lr else 0.1),
        "__WARMUP_START__": repr(lr.warmup_start_lr if lr else 0.1),
        "__WARMUP__": repr(lr.warmup_steps if lr else 0),
        "__BETAS__": repr(betas),
        "__EPS__": repr(eps),
    }
    text = _SKELETON
    for token, value in fields.items():
        text = text.replace(token, value)
    return Export("python", "text/plain", "train.py", text)


# ----------------------------------------------------------------------------- registry

EXPORTERS: dict[str, Exporter] = {
    "torchrun": export_torchrun,
    "slurm": export_slurm,
    "kubernetes": export_kubernetes,
    "deepspeed": export_deepspeed,
    "accelerate": export_accelerate,
    "hf-trainer": export_hf_trainer,
    "lightning": export_lightning,
    "python": export_python,
}


def export(fmt: str, x: ExportInput) -> Export:
    """Raises KeyError for an unknown format (the web layer answers 404 with `EXPORTERS`)."""
    return EXPORTERS[fmt](x)
