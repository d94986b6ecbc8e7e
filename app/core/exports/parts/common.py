"""What every export format shares: its input and output types (from export_types), the plan
summary written at the top of each file, facts about the node groups, and the refusals.

Uneven (proportional) plans give replicas different micro-batches. DeepSpeed, the HF
Trainer, Lightning and Accelerate take one per-device batch size, so writing such a plan in
their formats would silently run a different, biased split: those exports refuse it with a
422 (`ExportUnsupported`) that names the nearest even alternative (`require_even`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.core.errors.domain import PlanError
from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.training import optimizer_sentence, schedule_sentence
from app.core.planner import plan as run_plan
from app.core.records.integers import divisors
from app.core.records.plan_request import Divisibility, PlanRequest
from app.core.records.record import record

# ----------------------------------------------------------------------------- text pieces


def comment(lines: list[str], mark: str = "#") -> str:
    return "\n".join(f"{mark} {line}".rstrip() for line in lines)


def summary_comment(x: ExportInput) -> str:
    """The plan's summary as a shell script's opening comment."""
    return comment(summary(x))


def summary(x: ExportInput) -> list[str]:
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
                + (
                    f"loss scale {g.loss_scale!r}"
                    if g.loss_scale is not None
                    else "loss normalised by tokens"
                )
            )
    if p.learning_rate is not None:
        lr = p.learning_rate
        lines.append(
            f"learning rate {lr.lr!r} ({lr.rule} rule from {lr.base_lr!r} per "
            + (f"{lr.base_batch_tokens} tokens), " if lr.base_batch_tokens else f"{lr.base_batch_size}), ")
            + (
                f"warmup {lr.warmup_steps} steps from {lr.warmup_start_lr!r}"
                if lr.warmup_steps
                else "no warmup"
            )
        )
        lines.append(schedule_sentence(x))
        lines.append(optimizer_sentence(x))
    lines += law_lines(x)
    lines += [f"warning: {w}" for w in p.warnings]
    return lines


def law_lines(x: ExportInput) -> list[str]:
    """Where the batch and the peak lr written here came from, when a scaling law gave them."""
    r = x.plan.recommendation
    if r is None:
        return []
    lines = []
    if r.batch_from == "law" and r.planned_batch_tokens is not None:
        lines.append(
            f"global batch {r.planned_batch_tokens} tokens ({r.planned_batch_size} sequences of "
            f"{r.sequence_length}) from the {r.law} scaling law: its {r.batch_tokens:.0f} tokens, "
            f"snapped to the nearest batch this cluster splits exactly ({r.planned_vs_law_percent:+.2f}%)"
        )
    if r.lr_from == "law":
        lines.append(f"peak learning rate {r.lr!r} from the {r.law} scaling law (batchplan's recommendation)")
    return lines


def python_call(call: str, values: dict[str, Any], notes: dict[str, str]) -> str:
    """`call(` with one `key=repr(value),` per line, each followed by its note if it has one."""
    lines = [f"{call}("]
    for key, value in values.items():
        note = f"  # {notes[key]}" if key in notes else ""
        lines.append(f"    {key}={py_literal(value)},{note}")
    lines.append(")")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- node groups


@record
class NodeGroup:
    name: str
    num_nodes: int
    gpus_per_node: int
    first_node: int


def node_groups(x: ExportInput) -> list[NodeGroup]:
    out, node = [], 0
    for g in x.request.topology.node_groups:
        out.append(NodeGroup(g.name, g.num_nodes, g.gpus_per_node, node))
        node += g.num_nodes
    return out


def num_nodes(x: ExportInput) -> int:
    return sum(g.num_nodes for g in x.request.topology.node_groups)


def uniform_gpus_per_node(x: ExportInput) -> int | None:
    shapes = {g.gpus_per_node for g in x.request.topology.node_groups}
    return shapes.pop() if len(shapes) == 1 else None


def pinned_ranks(x: ExportInput) -> bool:
    """True when a rank's share depends on which node it runs on: the launch must then
    number nodes in node-group order (static rendezvous), not in c10d's join order."""
    return x.plan.split == "proportional" and len(x.request.topology.node_groups) > 1


# ----------------------------------------------------------------------------- refusals


# How many values of each batch field the search for an even split tries.
_TRIES = 6


def _splits_evenly(request: PlanRequest, **changes: Any) -> bool:
    """True when the request, with the batch fields in `changes`, plans an even split."""
    try:
        candidate = run_plan(replace(request, **changes))
    except PlanError:
        return False
    return candidate.micro_batch_size is not None


def _near(values: list[int], target: int) -> list[int]:
    return sorted(set(values), key=lambda v: (abs(v - target), v))


def _single_candidates(x: ExportInput) -> dict[str, list[int]]:
    """Values worth trying for each batch field, nearest first."""
    p, request = x.plan, x.request
    dp = p.data_parallel_size
    total = p.global_batch_size
    per = total // dp if total % dp == 0 else 0
    shares = divisors(per) if per else []
    caps = [g.max_micro_batch_size for g in p.replica_groups if g.max_micro_batch_size is not None]
    cap = min(caps) if caps else per
    unit = dp * (request.micro_batch_size or 1) * (request.gradient_accumulation_steps or 1)
    k = total // unit
    return {
        "micro_batch_size": _near([d for d in shares if d <= cap], cap)[:_TRIES],
        "gradient_accumulation_steps": _near([d for d in shares if per // d <= cap], 1)[:_TRIES],
        "global_batch_size": _near([unit * j for j in range(k - 2, k + 4) if j >= 1], total),
    }


def even_alternative(x: ExportInput) -> dict[str, list[int]]:
    """Values that each, substituted alone into the request, give an even split: what every
    format that takes one batch size for all processes needs. Never the value already sent."""
    request = x.request
    found: dict[str, list[int]] = {}
    for field, candidates in _single_candidates(x).items():
        current = getattr(request, field)
        good = [v for v in candidates if v != current and _splits_evenly(request, **{field: v})]
        if good:
            found[field] = good[:3]
    return found


def even_pairs(x: ExportInput) -> list[dict[str, int]]:
    """Global batches that split evenly only with an explicit micro-batch, as pairs that go
    together: the nearest whole per-replica shares below and above, each checked by planning."""
    p, request = x.plan, x.request
    dp = p.data_parallel_size
    caps = [g.max_micro_batch_size for g in p.replica_groups if g.max_micro_batch_size is not None]
    cap = min(caps) if caps else None
    base = p.global_batch_size // dp
    pairs: dict[int, int] = {}
    for per_replica in sorted({max(base, 1), base + 1}):
        allowed = [d for d in divisors(per_replica) if cap is None or d <= cap]
        if not allowed:
            continue
        total, micro = per_replica * dp, allowed[-1]
        if total == request.global_batch_size or micro == request.micro_batch_size:
            continue  # only one field changes: a single suggestion, if it works
        both = {"global_batch_size": total, "micro_batch_size": micro}
        if _splits_evenly(request, global_batch_size=total) or _splits_evenly(
            request, micro_batch_size=micro
        ):
            continue  # one of them works alone: the single suggestions say so
        if _splits_evenly(request, **both):
            pairs[total] = micro
    order = _near(list(pairs), p.global_batch_size)
    return [{"global_batch_size": total, "micro_batch_size": pairs[total]} for total in order]


_WAIT = " (faster GPUs then wait for slower ones)"


def _nearest_even(suggestions: dict[str, list[int]], pairs: list[dict[str, int]]) -> str:
    for field in ("micro_batch_size", "gradient_accumulation_steps", "global_batch_size"):
        if field in suggestions:
            return f"; {field} {suggestions[field][0]} alone gives an even split{_WAIT}"
    if pairs:
        return (
            f"; the nearest even split is global_batch_size {pairs[0]['global_batch_size']} together with "
            f"micro_batch_size {pairs[0]['micro_batch_size']}{_WAIT}"
        )
    return ""


def require_even(x: ExportInput, fmt: str, why: str) -> None:
    """Refuse an uneven plan for a format that takes one batch size for every process."""
    if x.plan.micro_batch_size is not None:
        return
    suggestions = even_alternative(x)
    pairs = even_pairs(x)
    raise ExportUnsupported(
        f"this plan gives replicas different micro-batches "
        f"({', '.join(str(g.micro_batch_size) for g in x.plan.replica_groups)}), and {fmt} {why}, "
        f"so it would run a different, unevenly weighted batch{_nearest_even(suggestions, pairs)}. Use the "
        f"python or torchrun export for the uneven split",
        pointer="/divisibility"
        if x.request.divisibility is Divisibility.BALANCE
        else "/topology/node_groups",
        suggestions=suggestions,
        combined_suggestions=pairs,
    )


def require_hf_datasets_splitter(x: ExportInput, splits: str) -> None:
    """Refuse a stream that a tool's own loader would not split: `splits` says who splits it
    ("torchtitan's loader splits its stream"), always with datasets' split_dataset_by_node."""
    dataset = x.request.dataset
    assert dataset is not None and dataset.stream is not None
    splitter = dataset.stream.splitter
    if splitter != "hf_datasets":
        raise ExportUnsupported(
            f"{splits} with datasets' split_dataset_by_node, not {splitter}: "
            'plan splitter "hf_datasets", or build the stream with the python export',
            pointer="/dataset/splitter",
        )


def require_data_parallel(x: ExportInput, fmt: str) -> None:
    """Refuse a model-parallel plan for a format whose every process is a data-parallel
    replica: it would run model-parallel-size times the planned batch."""
    p = x.plan
    if p.model_parallel_size > 1:
        # Each parallel size above 1 set to 1: alone where it is the only one, else together.
        sizes = {
            f"parallelism.{n}": 1
            for n in ("tensor", "pipeline", "context")
            if getattr(x.request.parallelism, n) > 1
        }
        raise ExportUnsupported(
            f"{fmt} is data-parallel only: it makes every one of the {p.world_size} processes a "
            f"data-parallel replica, and this plan has model-parallel size {p.model_parallel_size} "
            f"(data-parallel {p.data_parallel_size}): "
            f"it would run a global batch of {p.global_batch_size * p.model_parallel_size}, not "
            f"{p.global_batch_size}; use the deepspeed or torchrun export with your model-parallel "
            f"framework",
            pointer="/parallelism",
            suggestions={k: [v] for k, v in sizes.items()} if len(sizes) == 1 else {},
            combined_suggestions=[sizes] if len(sizes) > 1 else [],
        )


def require_uniform_nodes(x: ExportInput, fmt: str) -> int:
    """The GPUs per node, for a format that starts as many processes on every node."""
    shape = uniform_gpus_per_node(x)
    if shape is None:
        raise ExportUnsupported(
            f"{fmt} runs the same number of processes on every node, and these node groups have "
            f"{sorted({g.gpus_per_node for g in x.request.topology.node_groups})} GPUs per node; "
            f"use the torchrun or slurm export",
            pointer="/topology/node_groups",
        )
    return shape
