"""Check request parts that several tests build the same way (the request examples
themselves come from app.schemas)."""

from __future__ import annotations

import copy
import time
from typing import Any

from app.ports import free_port


def lonely_rendezvous(host: str = "127.0.0.1") -> dict[str, Any]:
    """A 2-node rendezvous on a free port whose second node never comes: a check naming it
    waits there, running, holding its ranks."""
    return {"endpoint": f"{host}:{free_port(host)}", "nnodes": 2, "run_id": f"lonely-{time.time_ns()}"}


def fast_and_slow(fast_throughput: float, global_batch_size: int) -> dict[str, Any]:
    """A plan over two one-GPU nodes of unequal speed: the split is proportional."""
    groups = [
        {"name": "fast", "num_nodes": 1, "gpus_per_node": 1, "relative_throughput": fast_throughput},
        {"name": "slow", "num_nodes": 1, "gpus_per_node": 1},
    ]
    return {"topology": {"node_groups": groups}, "global_batch_size": global_batch_size}


def sample_plan(
    num_nodes: int,
    gpus_per_node: int,
    global_batch_size: int,
    micro_batch_size: int,
    dataset: dict[str, Any],
    learning_rate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A plan by samples with its micro-batch given; its lr at the base (factor 1) unless
    `learning_rate` says."""
    return {
        "topology": {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node},
        "global_batch_size": global_batch_size,
        "micro_batch_size": micro_batch_size,
        "dataset": dataset,
        "learning_rate": learning_rate or {"base_lr": 0.1, "base_batch_size": global_batch_size},
    }


def node_groups(*groups: tuple[str, int, int, float]) -> dict[str, Any]:
    """A topology of node groups, each (name, num_nodes, gpus_per_node, relative_throughput)."""
    keys = ("name", "num_nodes", "gpus_per_node", "relative_throughput")
    return {"node_groups": [dict(zip(keys, group, strict=True)) for group in groups]}


def curve_group(
    name: str, num_nodes: int, gpus_per_node: int, max_micro_batch_size: int, curve: dict[int, float]
) -> dict[str, Any]:
    """A node group measured by its throughput curve: `curve` maps micro-batch sizes to samples/s."""
    return {
        "name": name,
        "num_nodes": num_nodes,
        "gpus_per_node": gpus_per_node,
        "max_micro_batch_size": max_micro_batch_size,
        "throughput_curve": [{"micro_batch_size": m, "samples_per_s": s} for m, s in curve.items()],
    }


def put(body: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`body` with `value` at the suggestion's key; the key's every part but the last must be
    there already: a suggestion changes a field of this request's shape (or an item of one of
    its lists, by index)."""
    changed = copy.deepcopy(body)
    *path, last = key.split(".")
    node: Any = changed
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value  # an IndexError: the key names no item the request has
    else:
        assert isinstance(node, dict), key
        node[last] = value
    return changed


# Warmup, cosine decay, weight decay and clipping that bites: every run-level control changes it.
RUN_RECIPE = {
    "base_lr": 0.1,
    "rule": "none",
    "warmup_steps": 3,
    "warmup_start_lr": 0.0,
    "decay": "cosine",
    "train_steps": 12,
    "weight_decay": 0.01,
    "max_grad_norm": 0.5,
}
