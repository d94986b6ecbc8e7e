"""A rank_worker stream's resume, perhaps on another data-parallel size: where each reader
starts again, and whether every later global batch is, as a set, the uninterrupted run's.

A counter-based stream (Mosaic's `sample_in_epoch` over its `num_canonical_nodes`, litdata's
`num_samples_yielded` per worker) resumes from one count because its global order does not
depend on the ranks. rank_worker's does on the readers alone: reader g = rank x workers +
worker reads the shards order[g::readers]. So the resumed run keeps the plan's readers, hosted
by data_parallel_size ranks of readers / data_parallel_size workers each; each reader skips
the samples its micro-batches delivered before the checkpoint, and batches the rest with the
plan's micro-batch.

The epoch's global order: global batch t is every rank's micro-batches t x accumulation ..
(t + 1) x accumulation - 1, as its DataLoader delivers them (round by round over its workers,
a finished worker skipped: app.core.split.stream.policy); `consumed_samples` is the samples of
the first global batches, the short micro-batches counted as they are. Whether the later global
batches are the same sets is counted step by step (app.core.resume.stream_verdict): each step,
each reader's micro-batches delivered in both runs (the rest of this epoch, and a whole epoch
from its start: every later epoch's counts are the same, shard sizes being equal or in their
own order).
"""

from __future__ import annotations

import dataclasses
from itertools import accumulate
from typing import TypeVar

from app.core.errors.domain import InvalidValue
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.integers import ceil_div
from app.core.records.plan import Plan
from app.core.records.plan_request import PlanRequest
from app.core.records.resume import ReaderResumeGroup, ResumeGroup, ResumePlan, ResumeSpec, StreamResume
from app.core.records.stream import StreamPlan, StreamSpec
from app.core.request.limits import MAX_WORKERS
from app.core.resume.stream_verdict import Delivery, exact_sizes, fits, verdict
from app.core.split.stream.checks import refuse_resume
from app.core.split.stream.layout import needs_order, shard_order, shard_sizes
from app.core.split.stream.policy import samples_in_first

MAX_READER_STEPS = 1 << 20  # readers x the steps compared: what a resume's verdict costs
_DP = "/resume/data_parallel_size"
_CONSUMED = "/resume/consumed_samples"


def _refuse_unplannable(spec: StreamSpec, plan: Plan) -> int:
    """The plan's one micro-batch; InvalidValue where this resume is not exact by counting."""
    if spec.end_of_epoch != "drop":
        raise InvalidValue(
            f'a stream resume is counted for end_of_epoch "drop" (the nearest valid value): under '
            f'"{spec.end_of_epoch}" a rank past its own stream repeats samples the readers no longer hold, '
            "and where that repeat starts depends on the ranks",
            pointer="/dataset/end_of_epoch",
        )
    if needs_order(spec, 1):
        raise InvalidValue(
            "a stream of unequal shards in a shuffled order has epochs of different lengths, which this "
            "resume does not count epoch by epoch: shuffle false (the nearest valid value), or equal shards",
            pointer="/dataset/shuffle",
        )
    sizes = {g.micro_batch_size for g in plan.replica_groups}
    if len(sizes) != 1:
        raise InvalidValue(
            "the ranks' micro-batches differ (a mixed cluster): a resumed reader's micro-batches would be "
            "cut at other samples. Resume on the plan's own ranks from the stream's own state",
            pointer=_DP,
            suggestions={"resume.data_parallel_size": [plan.data_parallel_size]},
        )
    return sizes.pop()


def _reader_samples(stream: StreamPlan) -> list[int]:
    """Each global reader's samples in an epoch, reader rank x workers + worker."""
    out: list[int] = []
    for g in stream.rank_groups:
        out.extend(list(g.worker_samples) * g.count)
    return out


def _trained_before(stream: StreamPlan, accumulation: int, step: int) -> int:
    """Samples of the epoch's first `step` global batches."""
    x = step * accumulation
    return sum(
        samples_in_first(g.worker_samples, g.micro_batch_size, x) * g.count for g in stream.rank_groups
    )


def _step(asked: ResumeSpec, stream: StreamPlan, accumulation: int) -> int:
    given = [name for name in ("optimizer_step", "consumed_samples") if getattr(asked, name) is not None]
    if len(given) != 1:
        raise InvalidValue(
            "resume takes optimizer_step (steps taken before the checkpoint) or consumed_samples"
            + (", not both" if given else ": give one of them"),
            pointer=_CONSUMED if given else "/resume",
        )
    if asked.optimizer_step is not None:
        if asked.optimizer_step < 0:
            raise InvalidValue("resume.optimizer_step must be >= 0", pointer="/resume/optimizer_step")
        return asked.optimizer_step
    consumed = asked.consumed_samples or 0
    per_epoch, S = stream.samples_trained, stream.optimizer_steps_per_epoch
    epoch, rest = divmod(max(consumed, 0), per_epoch)
    low, high = 0, S  # the last step whose global batches end at or before `rest`
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if _trained_before(stream, accumulation, mid) <= rest else (low, mid - 1)
    before = _trained_before(stream, accumulation, low)
    if consumed >= 0 and before == rest:
        return epoch * S + low
    near = [epoch * per_epoch + before, epoch * per_epoch + _trained_before(stream, accumulation, low + 1)]
    raise InvalidValue(
        f"resume.consumed_samples {consumed} does not end a global batch of the stream's epoch order (global "
        f"batch t is every rank's micro-batches of step t, their short last ones as they are): the "
        f"nearest that do are {near[0]} and {near[1]}",
        pointer=_CONSUMED,
        suggestions={"resume.consumed_samples": [n for n in near if n >= 0]},
    )


def _new_world(readers: int, replicas: int, micro: int, batch: int) -> tuple[int, int]:
    """(workers per rank, accumulation) of the resumed run: the same readers and global batch."""
    sizes = fits(readers, micro, batch)
    if replicas in sizes:
        return readers // replicas, batch // (replicas * micro)
    near = sorted(sizes, key=lambda d: (abs(d - replicas), d))[:2]
    raise InvalidValue(
        f"a rank_worker stream resumes on ranks that host the plan's {readers} readers (its shards are "
        f"order[g::{readers}] for reader g) with its micro-batch of {micro} and global batch of {batch}: "
        f"data_parallel_size must divide {readers} into at most {MAX_WORKERS} workers per rank and the "
        f"global batch into micro-batches of {micro}; {replicas} does not",
        pointer=_DP,
        suggestions={"resume.data_parallel_size": sorted(near)},
    )


_Group = TypeVar("_Group", ReaderResumeGroup, ResumeGroup)


def _append_merged(groups: list[_Group], group: _Group) -> None:
    """`group` (one reader or rank) after `groups`, or the last group stretched over it where
    their figures are the same: consecutive equal neighbours merged, as the plan's groups are."""
    last = groups[-1] if groups else None
    if last and dataclasses.replace(last, start=group.start, stop=group.stop) == group:
        groups[-1] = dataclasses.replace(last, stop=group.stop)
    else:
        groups.append(group)


def _reader_groups(
    spec: StreamSpec, epoch: int, readers: int, samples: list[int], done: list[int], b: int
) -> tuple[ReaderResumeGroup, ...]:
    sizes = shard_sizes(spec)
    order = shard_order(spec, epoch) or range(spec.num_shards)
    groups: list[ReaderResumeGroup] = []
    for g in range(readers):
        skip = min(samples[g], done[g] * b)
        own = [sizes[s] for s in order[g::readers]]
        k = next((i for i, end in enumerate(accumulate(own)) if end > skip), len(own))
        offset = skip - sum(own[:k])
        _append_merged(groups, ReaderResumeGroup(g, g + 1, k, offset, skip, done[g]))
    return tuple(groups)


def _rank_groups(samples: list[int], done: list[int], Kn: int, b: int) -> tuple[ResumeGroup, ...]:
    groups: list[ResumeGroup] = []
    for r in range(len(samples) // Kn):
        span = range(r * Kn, (r + 1) * Kn)
        done_span = sum(done[g] for g in span)
        _append_merged(
            groups, ResumeGroup(r, r + 1, b, done_span, sum(min(samples[g], done[g] * b) for g in span))
        )
    return tuple(groups)


# Over 60 lines: the position, the resumed world, its verdict and the answer read off one another.
def stream_resumed(request: PlanRequest, plan: Plan) -> Plan:
    """`plan` (a stream's) with its `resume`; InvalidValue where it cannot be resumed, saying why."""
    stream, asked = plan.stream, request.resume
    spec = request.dataset.stream if request.dataset is not None else None
    assert stream is not None and asked is not None and spec is not None
    if stream.splitter != "rank_worker":
        raise refuse_resume(stream.splitter)
    b = _refuse_unplannable(spec, plan)
    a, W, R = plan.gradient_accumulation_steps, plan.data_parallel_size, stream.readers
    S = stream.optimizer_steps_per_epoch
    step = _step(asked, stream, a)
    total = plan.learning_rate.train_steps if plan.learning_rate is not None else None
    if total is not None and step >= total:
        raise InvalidValue(
            f"resume at optimizer step {step} is past the run's end: the run has {total} optimizer steps",
            pointer="/resume/optimizer_step" if asked.optimizer_step is not None else _CONSUMED,
        )
    replicas = asked.data_parallel_size or W
    Kn, an = _new_world(R, replicas, b, plan.global_batch_size)
    epoch, j = divmod(step, S)
    cost = R * (2 * S - j)
    if cost > MAX_READER_STEPS:
        raise InvalidValue(
            f"a stream resume's verdict is counted reader by reader and step by step, up to "
            f"{MAX_READER_STEPS} readers x steps; this one is {R} x {2 * S - j}",
            pointer="/resume",
        )
    samples = _reader_samples(stream)
    counts = [ceil_div(n, b) for n in samples]
    K = R // W
    done = Delivery(counts, K).taken(j * a)
    why = verdict(counts, j, (K, a, S), (Kn, an))
    tries = min(8, MAX_READER_STEPS // cost - 1)  # sizes tried for a suggestion, within the same bound
    exact = exact_sizes(counts, j, (K, a, S), replicas, b, plan.global_batch_size, tries) if why else []
    steps_after = min(sum(counts[r : r + Kn]) for r in range(0, R, Kn)) // an
    resume = ResumePlan(
        optimizer_step=step,
        consumed_samples=epoch * stream.samples_trained + _trained_before(stream, a, j),
        epoch=epoch,
        step_in_epoch=j,
        data_parallel_size=replicas,
        micro_batch_size=b,
        gradient_accumulation_steps=an,
        skip_micro_batches=j * a,
        replica_groups=_rank_groups(samples, done, Kn, b),
        lr=lr_of(plan.learning_rate, step) if plan.learning_rate is not None else None,
        remaining_steps=total - step if total is not None else None,
        optimizer_steps_per_epoch=steps_after,
        optimizer_steps_per_epoch_before=S,
        optimizer_steps_per_epoch_after=steps_after,
        same_global_batches=why is None,
        why=why,
        suggestions={"resume.data_parallel_size": exact} if exact else {},
        stream=StreamResume(R, Kn, _reader_groups(spec, epoch, R, samples, done, b)),
    )
    warnings = plan.warnings
    if why is not None:
        near = f" (exact on data_parallel_size {' or '.join(map(str, exact))})" if exact else ""
        warnings += (
            f"the resumed stream's later global batches differ from the uninterrupted run's: {why}{near}",
        )
    return dataclasses.replace(
        plan, resume=resume, warnings=warnings, explanation=(*plan.explanation, _sentence(resume))
    )


def _sentence(resume: ResumePlan) -> str:
    assert resume.stream is not None
    verdict = (
        "every later global batch is, as a set, the uninterrupted run's"
        if resume.same_global_batches
        else f"later global batches differ ({resume.why})"
    )
    return (
        f"The stream resumes at optimizer step {resume.optimizer_step} (epoch {resume.epoch}, step "
        f"{resume.step_in_epoch} of it, {resume.consumed_samples} samples consumed) on "
        f"{resume.data_parallel_size} rank{'s' * (resume.data_parallel_size > 1)} of "
        f"{resume.stream.num_workers} DataLoader workers each, which keep "
        f"the plan's {resume.stream.readers} readers: reader g = rank x {resume.stream.num_workers} + worker "
        f"reads the same shards and skips what it had delivered (resume.stream.reader_groups); {verdict}."
    )
