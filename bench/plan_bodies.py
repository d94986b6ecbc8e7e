"""Varied, valid plan bodies for the HTTP benchmarks: no two requests in a row are the same,
so a response cache anywhere on the path (there is none; this keeps it so) could not count.

Each kind starts from a documented example and varies numbers that change the answer (the
global batch, the dataset's size and seed, a group's throughput) without changing its shape.
"""

from __future__ import annotations

from typing import Any

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)

from app.schemas.examples import plan_example

# The documented ImageNet example with its default divisibility spelled out, as the
# benchmark has always sent it: the README's plan body.
README_BODY = {**plan_example("dataset_and_lr"), "divisibility": "exact"}

KINDS = ("plans", "mixed")
DESCRIPTIONS = {
    "plans": "the README body (2x8 GPUs, ImageNet dataset, linear lr with warmup)",
    "mixed": "a mixed cluster (2x8 H100 at 2-2.9x, 1x4 A100, caps 64/32, dataset)",
}


def _readme(i: int) -> dict[str, Any]:
    body = {**README_BODY, "dataset": dict(README_BODY["dataset"])}
    body["global_batch_size"] = 512 + 16 * (i % 8 - 4)  # 448..560: every one splits evenly on 16
    body["dataset"]["num_samples"] = 1281167 + i
    body["dataset"]["seed"] = i
    return body


def _mixed(i: int) -> dict[str, Any]:
    body = plan_example("mixed")
    body["global_batch_size"] = 1000 + 4 * (i % 32)
    body["topology"]["node_groups"][0]["relative_throughput"] = 2.0 + (i % 8) / 8
    body["dataset"] = {"num_samples": 100000 + 7 * i, "seed": i}
    return body


def varied_bodies(kind: str, count: int = 64) -> list[dict[str, Any]]:
    """`count` different bodies of `kind` ("plans" or "mixed"), each one planned with a 200."""
    make = {"plans": _readme, "mixed": _mixed}[kind]
    return [make(i) for i in range(count)]
