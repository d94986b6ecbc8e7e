"""Plan request bodies for the answer-preserving tests: seeded random ones that reach every part
of the request (homogeneous and mixed clusters, meshes, tokens, datasets, learning rates, noise
scales, every divisibility mode), their broken variants, and hand-written bad requests.

Random bodies lean towards valid but many are refused (infeasible splits, bad meshes); both
kinds of answer are what the tests pin down.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from app.schemas.examples import INFEASIBLE_PLAN, OUT_OF_RANGE_PLAN, PLAN_EXAMPLES, STREAM_PLAN_EXAMPLES

MAX_SAFE = 2**53 - 1
DIVISIBILITY = ("exact", "round_down", "round_up", "balance")
RULES = ("linear", "sqrt", "none", "auto")
OPTIMIZERS = ("sgd", "lars", "adam", "adamw", "lamb")


def _maybe(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _topology(rng: random.Random) -> dict[str, Any]:
    if _maybe(rng, 0.6):
        return {
            "num_nodes": rng.choice([1, 2, 3, 4, 8, 16, 64, 125]),
            "gpus_per_node": rng.choice([1, 2, 4, 8]),
        }
    groups = []
    for i in range(rng.randint(1, 5)):
        group: dict[str, Any] = {"num_nodes": rng.randint(1, 6), "gpus_per_node": rng.choice([1, 2, 4, 8])}
        if _maybe(rng, 0.7):
            group["name"] = rng.choice(["h100", "a100", "v100", "l4", "mi300"]) + f"-{i}"
        if _maybe(rng, 0.7):
            group["relative_throughput"] = rng.choice(
                [0.5, 1, 1.0, 1.5, 2.0, 3, round(rng.uniform(0.3, 4), 3)]
            )
        if _maybe(rng, 0.5):
            group["max_micro_batch_size"] = rng.choice([1, 4, 16, 32, 64, 128])
        groups.append(group)
    return {"node_groups": groups}


def _batch(rng: random.Random, body: dict[str, Any]) -> None:
    form = rng.choice(["global", "global", "global_micro", "global_accum", "micro", "micro_accum", "all"])
    global_batch = rng.choice([1, 7, 64, 100, 256, 512, 1000, 1024, 4096, 8192, rng.randint(1, 20000)])
    micro = rng.choice([1, 2, 4, 8, 16, 32, 64])
    accum = rng.choice([1, 2, 4, 8])
    if "global" in form or form == "all":
        body["global_batch_size"] = global_batch
    if "micro" in form or form == "all":
        body["micro_batch_size"] = micro
    if "accum" in form or form == "all":
        body["gradient_accumulation_steps"] = accum
    if _maybe(rng, 0.3):
        body["max_micro_batch_size"] = rng.choice([1, 8, 16, 32, 64])


def _parallelism(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, choices in (
        ("tensor", [1, 2, 4, 8]),
        ("pipeline", [1, 2, 4]),
        ("context", [1, 2]),
        ("data_parallel_shard", [1, 2, 4, 8]),
        ("expert", [1, 2, 4]),
    ):
        if _maybe(rng, 0.4):
            out[name] = rng.choice(choices)
    return out


def _learning_rate(rng: random.Random, tokens: bool) -> dict[str, Any]:
    lr: dict[str, Any] = {"base_lr": rng.choice([0.1, 3e-4, 1, 0.05, 1e-3])}
    if _maybe(rng, 0.5):
        lr["base_batch_size"] = rng.choice([32, 256, 1024])
    if _maybe(rng, 0.7):
        lr["rule"] = rng.choice(RULES)
    if _maybe(rng, 0.7):
        lr["optimizer"] = rng.choice(OPTIMIZERS)
    if _maybe(rng, 0.4):
        lr["warmup_epochs"] = rng.choice([0, 1, 2.5, 5])
    elif _maybe(rng, 0.4):
        lr["warmup_steps"] = rng.choice([0, 100, 2000])
    if _maybe(rng, 0.2):
        lr["betas"] = [rng.choice([0.8, 0.9, 0.95]), rng.choice([0.95, 0.999])]
    if _maybe(rng, 0.2):
        lr["eps"] = rng.choice([1e-8, 1e-6])
    if tokens and _maybe(rng, 0.4):
        lr["base_batch_tokens"] = rng.choice([65536, 1048576])
    return lr


def random_body(rng: random.Random) -> dict[str, Any]:
    """A plan request touching a random selection of every feature."""
    body: dict[str, Any] = {"topology": _topology(rng)}
    tokens = _maybe(rng, 0.2)
    if tokens:
        body["sequence_length"] = rng.choice([128, 2048, 4096])
        if _maybe(rng, 0.5):
            body["global_batch_tokens"] = body["sequence_length"] * rng.choice([64, 256, 1024])
        else:
            body["global_batch_size"] = rng.choice([64, 256, 512])
        if _maybe(rng, 0.4):
            body["micro_batch_tokens"] = body["sequence_length"] * rng.choice([1, 2, 4])
        if _maybe(rng, 0.6):
            body["loss_normalization"] = rng.choice(["sample", "token"])
    else:
        _batch(rng, body)
    if _maybe(rng, 0.6):
        body["divisibility"] = rng.choice(DIVISIBILITY)
    if _maybe(rng, 0.3):
        body["parallelism"] = _parallelism(rng)
    if _maybe(rng, 0.2):
        body["loss_reduction"] = rng.choice(["mean", "sum"])
    if _maybe(rng, 0.5):
        dataset: dict[str, Any] = {"num_samples": rng.choice([1, 999, 50000, 1281167, rng.randint(1, 10**7)])}
        for key, choices in (
            ("shuffle", [True, False]),
            ("seed", [0, 1, 42]),
            ("drop_last", [True, False]),
            ("epochs", [1, 3, 90]),
        ):
            if _maybe(rng, 0.4):
                dataset[key] = rng.choice(choices)
        body["dataset"] = dataset
    if _maybe(rng, 0.4):
        body["learning_rate"] = _learning_rate(rng, tokens)
    if _maybe(rng, 0.15):
        body["gradient_noise_scale"] = rng.choice([100, 4096.0, 1e5])
        if _maybe(rng, 0.5):
            body["gradient_noise_scale_stderr"] = rng.choice([0, 30, 300.5])
    return body


# Ways to break a valid body: one field at a time, so the answers carry suggestions.
_BREAKS: list[tuple[str, Any]] = [
    ("global_batch_size", 0),
    ("global_batch_size", -5),
    ("global_batch_size", "512"),
    ("global_batch_size", True),
    ("global_batch_size", 512.5),
    ("global_batch_size", MAX_SAFE + 1),
    ("micro_batch_size", 0),
    ("gradient_accumulation_steps", -1),
    ("max_micro_batch_size", 0),
    ("divisibility", "nearest"),
    ("loss_reduction", "max"),
    ("loss_normalization", "word"),
    ("parallelism", {"tensor": 0}),
    ("parallelism", {"tensor": 3}),
    ("parallelism", {"data_parallel_shard": 3}),
    ("parallelism", {"expert": 3}),
    ("dataset", {"num_samples": 0}),
    ("dataset", {"num_samples": 10, "colour": "red"}),
    ("learning_rate", {"base_lr": 0}),
    ("learning_rate", {"base_lr": 0.1, "warmup_epochs": 5}),
    ("learning_rate", {"base_lr": 0.1, "betas": [0.9, 1.0]}),
    ("gradient_noise_scale", -1),
    ("gradient_noise_scale_stderr", 10),
    ("sequence_length", 0),
    ("global_batch_tokens", 1000),
    ("micro_batch_tokens", 3),
    ("global_batch_sise", 512),
    ("topology", {"num_nodes": 2}),
    ("topology", {"num_nodes": 0, "gpus_per_node": 8}),
    ("topology", {"num_nodes": 10**6, "gpus_per_node": 11}),
    ("topology", {"node_groups": []}),
    ("topology", {"node_groups": [{"name": "a", "num_nodes": 1, "gpus_per_node": 1}] * 2}),
    ("topology", {"node_groups": [{"num_nodes": 1, "gpus_per_node": 1, "relative_throughput": 0}]}),
]


def broken_body(rng: random.Random) -> dict[str, Any]:
    """A random body with one field set to a wrong value (sometimes still a valid one)."""
    body = random_body(rng)
    field, value = rng.choice(_BREAKS)
    body[field] = copy.deepcopy(value)
    return body


def example_bodies() -> list[tuple[str, dict[str, Any]]]:
    """Every documented plan request, and the two documented refusals."""
    shown = {**PLAN_EXAMPLES, **STREAM_PLAN_EXAMPLES}
    out = [(f"example-{name}", copy.deepcopy(ex["value"])) for name, ex in shown.items()]
    out += [("example-infeasible", copy.deepcopy(INFEASIBLE_PLAN))]
    out += [("example-out-of-range", copy.deepcopy(OUT_OF_RANGE_PLAN))]
    return out


def large_bodies() -> list[tuple[str, dict[str, Any]]]:
    """Big topologies: many GPUs (the answer must not grow) and many node groups (it grows)."""
    rng = random.Random(2026)
    many = [
        {
            "name": f"g{i}",
            "num_nodes": rng.randint(1, 4),
            "gpus_per_node": rng.choice([4, 8]),
            "relative_throughput": rng.choice([0.5, 1.0, 2.0, 3.0]),
            "max_micro_batch_size": rng.choice([None, 16, 32, 64]),
        }
        for i in range(300)
    ]
    million = {"num_nodes": 125000, "gpus_per_node": 8}
    return [
        (
            "large-1e6-gpus",
            {
                "topology": million,
                "global_batch_size": 4000000,
                "dataset": {"num_samples": 10**9, "epochs": 3},
                "learning_rate": {"base_lr": 0.1, "warmup_epochs": 1},
            },
        ),
        ("large-1e7-gpus", {"topology": {"num_nodes": 1250000, "gpus_per_node": 8}, "micro_batch_size": 2}),
        (
            "large-300-groups",
            {
                "topology": {"node_groups": many},
                "global_batch_size": 60000,
                "dataset": {"num_samples": 10**7},
            },
        ),
        (
            "large-300-groups-balance",
            {"topology": {"node_groups": many}, "global_batch_size": 59999, "divisibility": "balance"},
        ),
        (
            "large-300-groups-infeasible",
            {"topology": {"node_groups": many}, "global_batch_size": 59999, "gradient_accumulation_steps": 7},
        ),
    ]


def dumps(body: Any) -> bytes:
    """As a client library sends JSON: compact, UTF-8."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
