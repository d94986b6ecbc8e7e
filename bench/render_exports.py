"""Every export format rendered for a fixed set of plan bodies, written to files, so that a
refactor can show its exported scripts are byte-identical before and after.

    .venv/bin/python bench/render_exports.py --out /tmp/renders-before
    ... change the code ...
    .venv/bin/python bench/render_exports.py --out /tmp/renders-after --compare /tmp/renders-before

Each file is what `POST /v1/plans/export/{format}` answers (status line, content type, body),
through the app in-process with the worker off. The bodies: the documented plan examples
(`app.schemas.examples`), the plans of the documented check examples, an uneven mixed plan,
a mesh plan and a token plan; each with preflight on and off, and once with a model factory.
It prints how many renders it wrote and, with --compare, how many differ (a list of them).
Not a test: it asserts nothing and exits 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common  # noqa: F401  # puts the repository root on sys.path
from fastapi.testclient import TestClient

from app.core.exports.registry import EXPORTERS
from app.main import create_app
from app.schemas.check_examples import CHECK_EXAMPLES
from app.schemas.examples import PLAN_EXAMPLES, h100_and_a100, plan_example
from app.settings import Settings

EXTRA_BODIES: dict[str, dict[str, Any]] = {
    "uneven_mixed": h100_and_a100(
        {"num_nodes": 1, "gpus_per_node": 3, "relative_throughput": 2.0},
        {"num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
        global_batch_size=70,
        max_micro_batch_size=9,
        dataset={"num_samples": 1000, "epochs": 2},
        learning_rate={"base_lr": 0.1, "base_batch_size": 32, "optimizer": "sgd", "warmup_epochs": 1},
    ),
    "mesh_hsdp_tp": {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "parallelism": {"tensor": 2, "data_parallel_shard": 2},
        "global_batch_size": 64,
        "micro_batch_size": 4,
        "dataset": {"num_samples": 5000, "epochs": 1},
    },
    "tokens": {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "sequence_length": 16,
        "global_batch_tokens": 256,
        "micro_batch_tokens": 32,
        "loss_normalization": "token",
    },
}

VARIANTS: dict[str, dict[str, str]] = {
    "preflight": {},
    "no_preflight": {"preflight": "false"},
    "factory": {"model_factory": "app.worker.example_models:mlp", "setup": "source /venv/bin/activate"},
}


def bodies() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in PLAN_EXAMPLES:
        yield f"plan_{name}", plan_example(name)
    for name, example in CHECK_EXAMPLES.items():
        yield f"check_{name}", example["value"]["plan"]
    yield from EXTRA_BODIES.items()


def render(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as client:
        for body_name, body in bodies():
            for fmt in EXPORTERS:
                for variant, query in VARIANTS.items():
                    response = client.post(f"/v1/plans/export/{fmt}", params=query, json=body)
                    path = out / f"{body_name}__{fmt}__{variant}.txt"
                    head = f"{response.status_code} {response.headers.get('content-type')}\n"
                    path.write_bytes(head.encode() + response.content)
                    written.append(path)
    return written


def compare(out: Path, baseline: Path) -> list[str]:
    ours = {p.name for p in out.glob("*.txt")}
    theirs = {p.name for p in baseline.glob("*.txt")}
    differ = sorted(ours ^ theirs)
    differ += sorted(n for n in ours & theirs if (out / n).read_bytes() != (baseline / n).read_bytes())
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the renders")
    parser.add_argument("--compare", type=Path, help="a folder of earlier renders to compare with")
    args = parser.parse_args()
    written = render(args.out)
    refused = sum(1 for p in written if not p.read_text().startswith("200 "))
    print(f"{len(written)} renders in {args.out} ({len(written) - refused} exports, {refused} refusals)")
    if args.compare is not None:
        differ = compare(args.out, args.compare)
        print(f"against {args.compare}: {len(written) - len(differ)} identical, {len(differ)} differ")
        for name in differ:
            print(f"  differs: {name}")


if __name__ == "__main__":
    main()
