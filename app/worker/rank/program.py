"""The rank program: one training step of a plan (DDP replicas, the tokens workload or the
plan's mesh), checked against a single-process gradient over the same global batch.

It imports only torch, the standard library and the pure core, so it runs wherever torch
runs. The warm ranks of the worker call `checks.driver.run_spec` themselves; on a cluster
torchrun starts this program (by its documented name, `app.worker.gradcheck`):

    python -m torch.distributed.run --nnodes N --nproc-per-node G --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT -m app.worker.gradcheck --request '{"plan": {...}}' \
        [--model-factory package.module:factory]

and rank 0 prints the result JSON. With --model-factory it trains the user's own model (see
`app.worker.training.workload`), which is how a model is checked in its own environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from app.contract.check_options import BACKENDS, DTYPES
from app.contract.check_result import CheckResult
from app.contract.codec import encode
from app.contract.mesh_spec import mesh_world
from app.contract.model_registry import SYNTHETIC, TARGET, parse_models
from app.contract.request import build_spec, check_request
from app.contract.spec import CheckSpec
from app.core.errors.domain import DomainError
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.token_check import refuse_before_group
from app.worker.rank.backend import choose_backend
from app.worker.training import mesh_models
from app.worker.training.workload import load


def _read_request(args: argparse.Namespace) -> dict[str, Any]:
    if args.request_file:
        text = sys.stdin.read() if args.request_file == "-" else Path(args.request_file).read_text()
    else:
        text = args.request
    data: dict[str, Any] = json.loads(text)
    for key in ("backend", "dtype", "seed"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    return data


def _model_target(requested: str | None, factory: str | None) -> tuple[str, str | None]:
    """(name, target): a factory given on the command line, else the request's model as
    this environment's BATCHPLAN_CHECK_MODELS registers it."""
    if factory:
        if not TARGET.match(factory):
            raise SystemExit(f"error: --model-factory {factory!r} is not package.module:factory")
        return factory, factory
    name = requested or SYNTHETIC
    if name == SYNTHETIC:
        return name, None
    return name, parse_models(os.environ.get("BATCHPLAN_CHECK_MODELS", "")).get(name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app.worker.gradcheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--request", help="the check request JSON, as POST /v1/checks takes it")
    source.add_argument("--request-file", help="a file holding it, or - for stdin")
    parser.add_argument("--backend", choices=BACKENDS)
    parser.add_argument("--dtype", choices=DTYPES)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--model-factory",
        metavar="PACKAGE.MODULE:FACTORY",
        help="train this factory's (model, dataset, loss_fn) instead of the request's model",
    )
    parser.add_argument(
        "--result-on-every-node",
        action="store_true",
        help="print rank 0's result on every node's first process too (for launch scripts that run "
        "on each node and judge from their own output; srun gathers every node's output in one)",
    )
    return parser


class _Refused(Exception):
    """The check cannot run as asked: said on stderr, exit status 2."""


def _said(err: DomainError) -> str:
    return f"{err.pointer}: {err.detail}" if err.pointer else err.detail


def _spec(args: argparse.Namespace, world: int) -> tuple[CheckSpec, str | None]:
    """The spec every rank runs (built as the HTTP worker builds it, refusing what it
    refuses) and the model's factory, or _Refused."""
    request = check_request(_read_request(args))
    name, target = _model_target(request.model, args.model_factory)
    if target is None and name != SYNTHETIC:
        raise _Refused(f"model {name!r} is not in BATCHPLAN_CHECK_MODELS here; give --model-factory")
    try:
        spec = build_spec(
            dataclasses.replace(request, options=dataclasses.replace(request.options, model=name)),
            factory=target,
            factory_flag=bool(args.model_factory),
        )
    except DomainError as err:
        raise _Refused(_said(err)) from None
    if spec.mesh is not None and world != mesh_world(spec.mesh):
        raise _Refused(
            f"the plan's device mesh {spec.mesh} has {mesh_world(spec.mesh)} ranks; start exactly "
            f"that many processes (one per mesh rank)"
        )
    if spec.mesh is None and world > spec.data_parallel_size:
        raise _Refused(
            f"{world} processes for {spec.data_parallel_size} replicas; start at most "
            f"{spec.data_parallel_size}"
        )
    return spec, target


def _check(spec: CheckSpec, target: str | None, args: argparse.Namespace) -> str | None:
    """Run the check in a process group formed from torchrun's environment: rank 0's result as
    the line it prints (on every node's first process too, with --result-on-every-node), else
    None."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    backend, device = choose_backend(spec.backend, local_world, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    workload = load(spec.model, target, spec.seed)
    refuse_before_group(spec, workload)
    started = time.perf_counter()
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    setup = time.perf_counter() - started
    try:
        nnodes = max(1, world // local_world)
        result = run_spec(spec, CheckGroup(rank, world, device, backend, nnodes), workload, target)
        shared = [_printed(result.with_setup_time(setup)) if result is not None else None]
        if args.result_on_every_node:
            # Each node's launch script judges a preflight from its own output: no node may
            # go on to train alone because rank 0's verdict was printed elsewhere.
            dist.broadcast_object_list(shared, src=0)
    finally:
        mesh_models.forget_meshes()  # before the group: the meshes' modules live on its groups
        dist.destroy_process_group()
    return shared[0] if rank == 0 or local_rank == 0 else None


def _printed(result: CheckResult) -> str:
    """The result's JSON line: `passed` first, where the launch exports' preflight finds it (the
    line that begins '{"passed"')."""
    answer = encode(result)
    return json.dumps({"passed": answer["passed"], **answer})


def main(argv: Iterator[str] | None = None) -> int:
    """Entry point under torchrun: rank, world and rendezvous come from its environment."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        spec, target = _spec(args, int(os.environ.get("WORLD_SIZE", "1")))
        # What only the model's data shows (a tokens check's sequence length) is refused by
        # every rank alike once the model is built: said as plainly, not as a traceback.
        result = _check(spec, target, args)
    except _Refused as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    except DomainError as err:
        print(f"error: {_said(err)}", file=sys.stderr)
        return 2
    if result is not None:
        print(result, flush=True)
    return 0
