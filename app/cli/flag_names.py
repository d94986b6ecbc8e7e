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
from collections.abc import Mapping, Sequence
from typing import Any

from app.cli.help_panels import PanelCommand
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
    "dataset.kind": "stream",
    "port": "master_port",
    "timeout_s": "timeout",
    "noise_scale.steps": "noise_steps",
    "noise_scale.learning_rate": "noise_lr",
    "fit_micro_batch.memory_bytes": "fit_memory_bytes",
    "fit_micro_batch.safety_margin": "safety_margin",
    "learning_rate": "base_lr",  # the whole recipe, asked for where there is none: its first flag
    "learning_rate.lr_scaling": "lr_scaling_result",
    "resume.optimizer_step": "resume_step",
    "resume.consumed_samples": "resume_samples",
    "resume.data_parallel_size": "resume_replicas",
    "resume.at_step": "resume_at",
    "lr_scaling.samples": "lr_scaling",
    "lr_scaling.rules": "lr_rules",
    "lr_scaling.epochs": "lr_epochs",
    "lr_scaling.seeds": "lr_seeds",
    "lr_scaling.tolerance": "lr_tolerance",
    "lr_scaling.tolerance_unit": "lr_tolerance_unit",
    "throughput.warmup_steps": "measure_warmup_steps",
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


class FlagCommand(PanelCommand):
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
    errors, detail = problem.get("errors"), problem.get("detail")
    if isinstance(errors, list):
        out["errors"] = [
            {**e, "pointer": name.pointer(e["pointer"])} if isinstance(e, dict) and e.get("pointer") else e
            for e in errors
        ]
        first = errors[0] if errors and isinstance(errors[0], dict) else {}
        pointer = first.get("pointer")
        if isinstance(detail, str) and pointer and detail.startswith(f"{pointer}: "):
            out["detail"] = f"{name.pointer(pointer)}: {detail[len(pointer) + 2 :]}"
    if isinstance(detail, str) and not name.from_file:
        out["detail"] = name.text(out["detail"])
    if isinstance(out.get("errors"), list) and not name.from_file:
        out["errors"] = [
            {**e, "detail": name.text(e["detail"])}
            if isinstance(e, dict) and isinstance(e.get("detail"), str)
            else e
            for e in out["errors"]
        ]
    suggestions = problem.get("suggestions")
    if isinstance(suggestions, dict):
        out["suggestions"] = {name.key(k): v for k, v in suggestions.items()}
    return out


def suggestion_lines(suggestions: Mapping[str, Any]) -> list[str]:
    """Each suggestion as the user would type it, in one form: `--resume-at 19 (or 20)`, a node
    group as its whole `--node-group`; a field the flags did not set (a `--request` file's) as
    `field: 19, 20`."""
    ctx = _RUNNING.get(None)
    name = _Namer(ctx) if ctx is not None and ARGS in ctx.meta else None
    lines = []
    for key, values in suggestions.items():
        listed = values if isinstance(values, list) else [values]
        typed = name.typed(key, listed) if name is not None else None
        lines.append(typed if typed is not None else f"{key}: {', '.join(map(str, listed))}")
    return lines


# The request's objects: a dotted word under one of them names a request field.
_REQUEST_OBJECTS = frozenset(
    {"plan", "topology", "parallelism", "dataset", "learning_rate", "resume", "lr_scaling", "throughput"}
    | {"noise_scale", "fit_micro_batch", "recommend", "rendezvous", "architecture", "packing"}
)
# A request field in a problem's words: dotted or with an underscore, not inside a JSON key.
_FIELD_WORD = re.compile(r'(?<![\w"/.$-])([a-z][a-z0-9]*(?:[._][a-z0-9]+)+)(?![\w"(-])')


class _Namer:
    def __init__(self, ctx: Any) -> None:
        self.args: list[str] = ctx.meta[ARGS]
        self.params = {p.name: p for p in ctx.command.params if p.param_type_name == "option"}
        # Under --request the file holds the fields: only a flag the user typed is named.
        self.from_file = ctx.params.get("request") is not None
        self.groups: list[str] = list(ctx.params.get("node_groups") or [])

    def text(self, detail: str) -> str:
        """`detail` with each request field it names that a flag set named by that flag."""

        def named(match: re.Match[str]) -> str:
            word = match.group(1)
            if "." in word and word.split(".", 1)[0] not in _REQUEST_OBJECTS:
                return word  # another object's field (`result.lr_scaling`), not the request's
            flag = self._named(word.split("."))
            return flag if flag is not None and flag.startswith("-") else word

        return _FIELD_WORD.sub(named, detail)

    def typed(self, key: str, values: list[Any]) -> str | None:
        """The suggestion as arguments, or None where no flag sets `key`."""
        parts = key.split(".")
        group = self._group_values(parts, values)
        if group is not None:
            return group
        flag = self._named(parts)
        if flag is None or not flag.startswith("-"):
            return None
        option = self.params[self._param(parts)]
        if all(isinstance(v, bool) for v in values) and option.secondary_opts:
            return " or ".join(flag if v else option.secondary_opts[0] for v in values)
        texts = [",".join(map(str, v)) if isinstance(v, list) else str(v) for v in values]
        rest = f" (or {', '.join(texts[1:])})" if len(texts) > 1 else ""
        return f"{flag} {texts[0]}{rest}"

    def _group_values(self, parts: list[str], values: list[Any]) -> str | None:
        """A node group's part suggested: the whole `--node-group` with that part changed."""
        if parts[:1] == ["plan"]:
            parts = parts[1:]
        if not (parts[:2] == ["topology", "node_groups"] and len(parts) == 4 and parts[2].isdigit()):
            return None
        index = int(parts[2])
        if parts[3] not in _NODE_GROUP_PARTS or index >= len(self.groups) or self.from_file:
            return None
        part = list(_NODE_GROUP_PARTS).index(parts[3]) + 1  # after the group's NAME
        typed = self.groups[index].split(":")
        if part >= len(typed):
            return None
        groups = [":".join([*typed[:part], str(v), *typed[part + 1 :]]) for v in values]
        return " or ".join(f"--node-group {g}" for g in groups)

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
        return self._flag(self._param(parts))

    @staticmethod
    def _param(parts: list[str]) -> str:
        if parts[:1] == ["plan"] and len(parts) > 1:
            parts = parts[1:]
        while len(parts) > 1 and parts[-1].isdigit():
            parts = parts[:-1]  # an item of a list field: the list's flag
        return _param_name(parts)

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
