"""The elastic table the python skeleton carries: for each data-parallel size the run may go on
with after a restart (torchrun's elastic agent restarts it on the nodes that are left), the
micro-batch and accumulation that keep the plan's global batch, and whether a resume there is
exact (every later step sees the uninterrupted run's global batch: the epoch ends where it
does on the plan's own size). Planned by app.core.resume.plan_resume, the arithmetic POST /v1/plans
answers with `resume`.

Which sizes: every divisor of the global batch up to the largest data-parallel size the run
may have (the plan's, or the elastic launch's most nodes), the largest MAX_SIZES of them.
"""

from __future__ import annotations

import hashlib

from app.core.errors.domain import DomainError
from app.core.exports.parts.export_types import ExportInput
from app.core.planner import plan as run_plan
from app.core.records.integers import divisors
from app.core.records.plan import Plan
from app.core.records.record import record
from app.core.resume.layout import epoch_tail
from app.core.resume.plan_resume import resumed_plan

MAX_SIZES = 64


@record
class TableEntry:
    data_parallel_size: int
    micro_batch_size: int | None  # None: the plan's own uneven replica groups
    gradient_accumulation_steps: int
    exact: bool | None  # None: the plan has no dataset, so the epoch's end is unknown
    data_parallel_shard: int = 1  # FSDP's shard group there (the mesh skeleton's)


def _ends(p: Plan) -> tuple[int, int]:
    tail = epoch_tail(p)
    return tail.optimizer_steps, tail.last_step_end


def _shard(p: Plan) -> int:
    return p.device_mesh.data_parallel_shard if p.device_mesh is not None else 1


def largest_data_parallel_size(x: ExportInput) -> int:
    """The most data-parallel replicas the run may have: the plan's, or the elastic launch's
    most nodes' (the plan's GPUs per node on each)."""
    p, elastic = x.plan, x.options.elastic
    if elastic is None:
        return p.data_parallel_size
    per_node = max(g.gpus_per_node for g in x.request.topology.node_groups)
    return max(p.data_parallel_size, elastic[1] * per_node // p.model_parallel_size)


def elastic_table(x: ExportInput) -> list[TableEntry]:
    """The sizes the run may go on with, ascending; the plan's own always among them."""
    p = x.plan
    own = TableEntry(
        p.data_parallel_size,
        p.micro_batch_size,
        p.gradient_accumulation_steps,
        True if p.sampler else None,
        _shard(p),
    )
    if p.split != "even":
        return [own]  # its shares follow throughputs: no other count resumes it (app.core.resume.plan_resume)
    high = largest_data_parallel_size(x)
    sizes = [d for d in divisors(p.global_batch_size) if d <= high][-MAX_SIZES:]
    out = []
    for size in sizes:
        if size == p.data_parallel_size:
            out.append(own)
            continue
        try:
            new = resumed_plan(x.request, p, size, run_plan)
        except DomainError:
            continue  # the mesh or the cap does not allow it: the skeleton refuses that size
        exact = _ends(p) == _ends(new) if p.sampler is not None else None
        out.append(
            TableEntry(size, new.micro_batch_size, new.gradient_accumulation_steps, exact, _shard(new))
        )
    if own not in out:
        out.append(own)
    return sorted(out, key=lambda e: e.data_parallel_size)


def run_id(x: ExportInput) -> str:
    """A run's identity, the same at every world size: its global batch, data, recipe and loss."""
    r = x.request
    facts = (x.plan.global_batch_size, r.dataset, r.learning_rate, r.loss_reduction, r.loss_normalization)
    return hashlib.sha256(repr((*facts, r.sequence_length)).encode()).hexdigest()[:12]


def table_source(entries: list[TableEntry], shards: bool = False) -> str:
    """The table as a Python dict literal: {size: (micro-batch, accumulation, exact)}, and each
    size's FSDP shard group last with `shards`."""
    items = ", ".join(
        f"{e.data_parallel_size}: ({e.micro_batch_size!r}, {e.gradient_accumulation_steps}, {e.exact!r}"
        + (f", {e.data_parallel_shard})" if shards else ")")
        for e in entries
    )
    return "{" + items + "}"
