"""The elastic plan's resume (POST /v1/plans/elastic with `dataset` and `resume`): for every GPU
count the search found, where a run checkpointed at `optimizer_step` on `data_parallel_size`
replicas goes on when it is restarted on that count, and whether every later step then sees
the global batch the uninterrupted run would have seen. The same arithmetic as a plan's
resume (app.core.resume.plan_resume, app.core.resume.layout), over the counts' DistributedSampler epochs:
the global batch is the same at every count, so each step reads the same block of the epoch's
order; only where an epoch ends (padding to a multiple of the count, drop_last) differs.
"""

from __future__ import annotations

from app.core.errors.domain import InvalidValue
from app.core.records.integers import nearest
from app.core.records.plan_request import DatasetSpec
from app.core.records.record import record
from app.core.records.resume import EpochTail
from app.core.resume.layout import sampler_tail, tail_difference
from app.core.split.sampler import even_sampler


@record
class ElasticResumeSpec:
    optimizer_step: int
    data_parallel_size: int  # the run's, when it was checkpointed: one of the valid counts


@record
class CountResume:
    epoch: int  # the uninterrupted run's, at the step
    step_in_epoch: int
    skip_micro_batches: int  # each rank's, from the epoch's start, on this count
    same_global_batches: bool


def _tail(dataset: DatasetSpec, gpus: int, micro: int, accumulation: int, batch: int) -> EpochTail:
    return sampler_tail(batch, even_sampler(dataset, gpus, micro, accumulation))


def count_resumes(
    counts: list[tuple[int, int, int]], batch: int, dataset: DatasetSpec | None, spec: ElasticResumeSpec
) -> list[CountResume]:
    """Per (gpus, micro-batch, accumulation) of the elastic plan, the resume there."""
    if dataset is None:
        raise InvalidValue(
            "a resume needs dataset (num_samples, ...): where a step lies in its epoch depends on it",
            pointer="/resume",
        )
    by_gpus = {gpus: (micro, accumulation) for gpus, micro, accumulation in counts}
    if spec.data_parallel_size not in by_gpus:
        raise InvalidValue(
            f"resume.data_parallel_size {spec.data_parallel_size} is not one of the counts this elastic plan "
            f"runs on: the run was checkpointed on one of them",
            pointer="/resume/data_parallel_size",
            suggestions={"resume.data_parallel_size": nearest(list(by_gpus), spec.data_parallel_size)},
        )
    tails = {gpus: _tail(dataset, gpus, micro, acc, batch) for gpus, (micro, acc) in by_gpus.items()}
    run = tails[spec.data_parallel_size]
    if run.optimizer_steps == 0:
        raise InvalidValue(
            "the dataset's epoch holds no whole optimizer step", pointer="/dataset/num_samples"
        )
    total = run.optimizer_steps * dataset.epochs if dataset.epochs is not None else None
    step = spec.optimizer_step
    if step < 0 or (total is not None and step >= total):
        last = max((total or 1) - 1, 0)
        raise InvalidValue(
            f"resume at optimizer step {step} is outside the run's {total} optimizer steps",
            pointer="/resume/optimizer_step",
            suggestions={"resume.optimizer_step": [last]},
        )
    epoch, in_epoch = divmod(step, run.optimizer_steps)
    last_step = None
    if total is not None and (total - 1) // run.optimizer_steps == epoch:
        last_step = (total - 1) % run.optimizer_steps
    return [
        CountResume(
            epoch=epoch,
            step_in_epoch=in_epoch,
            skip_micro_batches=in_epoch * acc,
            same_global_batches=tail_difference(run, tails[gpus], batch, in_epoch, last_step) is None,
        )
        for gpus, _, acc in counts
    ]
