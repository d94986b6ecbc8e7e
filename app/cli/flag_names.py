"""Problems in the words the user typed: `-b`, not `global_batch_size`.

A problem names request fields (its pointers, its suggestions' keys), as the server words it.
Where the request was built from flags, each field the user set with a flag is named by the
flag as typed (`-b` or `--global-batch-size`), and one left to its default by its long flag; a
node group's field by its part of the `--node-group` the user wrote. A plan read from
`--request FILE` keeps the file's field names. `FlagCommand` records the arguments as typed and
names the nearest flags of an unknown one, where click's own guess finds none (`--gpus`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any

from typer.core import TyperCommand

from app.cli.options import PlanFlags
from app.client import Json

ARGS = "batchplan.args"
_PLAN_FLAGS = frozenset(f.name for f in dataclasses.fields(PlanFlags))
# The running command's context. Typer's click may be its own copy (typer >= 0.20 vendors it),
# so neither click.get_current_context nor click's exception classes are imported here.
_RUNNING: contextvars.ContextVar[Any] = contextvars.ContextVar("batchplan_command")
# A field whose flag is not named after it (the rest are: `parallelism.tensor` is `--tensor`).
_PARAM_OF = {
    "dataset.seed": "data_seed",
    "port": "master_port",
    "timeout_s": "timeout",
    "noise_scale.steps": "noise_steps",
    "noise_scale.learning_rate": "noise_lr",
    "fit_micro_batch.memory_bytes": "fit_memory_bytes",
    "fit_micro_batch.safety_margin": "safety_margin",
    "packing.mode": "packing",
    "packing.document_length.mean": "document_length_mean",
    "packing.document_length.max": "document_length_max",
}
_NODE_GROUP_PARTS = {
    "num_nodes": "NODES",
    "gpus_per_node": "GPUS_PER_NODE",
    "relative_throughput": "THROUGHPUT",
    "max_micro_batch_size": "CAP",
}
# Flags other tools spell differently, and the one meant here.
SYNONYMS = {
    "--gpus": "--gpus-per-node",
    "--nproc-per-node": "--gpus-per-node",
    "--nodes": "--num-nodes",
    "--nnodes": "--num-nodes",
    "--batch-size": "--global-batch-size",
    "--global-batch": "--global-batch-size",
    "--micro-batch": "--micro-batch-size",
    "--gradient-accumulation-steps": "--accumulation",
    "--lr": "--base-lr",
    "--learning-rate": "--base-lr",
    "--tp": "--tensor",
    "--pp": "--pipeline",
    "--cp": "--context",
    "--seq-len": "--sequence-length",
}


class FlagCommand(TyperCommand):
    """A command that keeps its arguments as typed, and suggests the flag an unknown one meant."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[ARGS] = list(args)
        try:
            return super().parse_args(ctx, args)
        except Exception as err:
            if type(err).__name__ != "NoSuchOption":
                raise
            near = nearest_flags(err.option_name, self._flags(ctx))  # type: ignore[attr-defined]
            if not near or set(near) == set(getattr(err, "possibilities", None) or ()):
                raise
            raise type(err)(err.option_name, possibilities=near, ctx=ctx) from None  # type: ignore[attr-defined,call-arg]

    def invoke(self, ctx: Any) -> Any:
        token = _RUNNING.set(ctx)
        try:
            return super().invoke(ctx)
        finally:
            _RUNNING.reset(token)

    def _flags(self, ctx: Any) -> list[str]:
        return [o for p in self.get_params(ctx) for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]


def nearest_flags(typed: str, flags: Sequence[str]) -> list[str]:
    """The flags `typed` may have meant: a synonym, the flags it begins, the closest spellings."""
    name = typed.split("=", 1)[0]
    near = [SYNONYMS[name]] if SYNONYMS.get(name) in flags else []
    near += [f for f in flags if f.startswith(name + "-") and f not in near]
    near += [f for f in difflib.get_close_matches(name, flags, n=3, cutoff=0.6) if f not in near]
    return near[:3]


def in_flags(problem: Json) -> Json:
    """`problem` with its pointers and suggestion keys named as flags, where the running command
    built the request from flags (nothing changes outside a command, or for --request's plan)."""
    ctx = _RUNNING.get(None)
    if ctx is None or ARGS not in ctx.meta:
        return problem
    name = _Namer(ctx)
    out = dict(problem)
    errors = problem.get("errors")
    if isinstance(errors, list):
        out["errors"] = [
            {**e, "pointer": name.pointer(e["pointer"])} if isinstance(e, dict) and e.get("pointer") else e
            for e in errors
        ]
        first = errors[0] if errors and isinstance(errors[0], dict) else {}
        detail, pointer = problem.get("detail"), first.get("pointer")
        if isinstance(detail, str) and pointer and detail.startswith(f"{pointer}: "):
            out["detail"] = f"{name.pointer(pointer)}: {detail[len(pointer) + 2 :]}"
    suggestions = problem.get("suggestions")
    if isinstance(suggestions, dict):
        out["suggestions"] = {name.key(k): v for k, v in suggestions.items()}
    return out


class _Namer:
    def __init__(self, ctx: Any) -> None:
        self.args: list[str] = ctx.meta[ARGS]
        self.params = {p.name: p for p in ctx.command.params if p.param_type_name == "option"}
        # Under --request the file holds the fields: only a flag the user typed is named.
        self.from_file = ctx.params.get("request") is not None
        self.groups: list[str] = list(ctx.params.get("node_groups") or [])

    def pointer(self, pointer: str) -> str:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.strip("/").split("/")]
        named = self._named(parts)
        return named if named is not None else pointer

    def key(self, key: str) -> str:
        named = self._named(key.split("."))
        return named if named is not None else key

    def _named(self, parts: list[str]) -> str | None:
        if parts[:1] == ["plan"] and len(parts) > 1:
            parts = parts[1:]  # a check's plan: its fields are the plan flags'
        if parts[:2] == ["topology", "node_groups"] and len(parts) == 4 and parts[2].isdigit():
            index, part = int(parts[2]), _NODE_GROUP_PARTS.get(parts[3])
            if part is not None and index < len(self.groups) and not self.from_file:
                return f"{part} of --node-group {self.groups[index]}"
            return None
        return self._flag(_param_name(parts))

    def _flag(self, param: str) -> str | None:
        option = self.params.get(param)
        if option is None:
            return None
        opts: list[str] = [*option.opts]
        typed = [o for o in opts if any(_is(arg, o) for arg in self.args)]
        if self.from_file:
            # The file's plan wins over the plan flags: only the other options name their flag.
            return typed[0] if typed and param not in _PLAN_FLAGS else None
        if typed:
            return typed[0]
        long = [o for o in opts if o.startswith("--")]
        return long[0] if long else opts[0]


def _param_name(parts: list[str]) -> str:
    dotted = ".".join(parts)
    return _PARAM_OF.get(dotted, parts[-1])


def _is(arg: str, opt: str) -> bool:
    """Whether the argument `arg` as typed is the option `opt` (`--x`, `--x=v`, `-b`, `-b512`)."""
    if opt.startswith("--"):
        return arg == opt or arg.startswith(opt + "=")
    return re.fullmatch(re.escape(opt) + r".*", arg) is not None and not arg.startswith("--")
