"""What a plan's resume says in words (app.core.resume.plan_resume): its warnings, where the epoch's tail
and the tools' own saved positions differ from the uninterrupted run, and its explanation."""

from __future__ import annotations

from app.core.records.plan import Plan
from app.core.records.resume import EpochTail, ResumePlan
from app.core.resume.layout import describe


def resume_warnings(
    plan: Plan, resume: ResumePlan, tail: EpochTail, new_tail: EpochTail, ends_here: bool
) -> list[str]:
    out = []
    replicas, dp = resume.data_parallel_size, plan.data_parallel_size
    if resume.why is not None:
        near = resume.suggestions.get("resume.data_parallel_size")
        out.append(
            f"resume on {replicas} replicas is not the uninterrupted run: {resume.why}"
            + (f"; data-parallel sizes that resume exactly: {near}" if near else "")
        )
    elif (tail.optimizer_steps, tail.last_step_end) != (new_tail.optimizer_steps, new_tail.last_step_end):
        out.append(
            f"the epoch's end depends on the replicas ({describe(new_tail, replicas)}, where "
            f"{describe(tail, dp)}), but the run ends before it: the resumed steps are the same"
        )
    batch = plan.global_batch_size
    held = tail.last_step_end - (tail.optimizer_steps - 1) * batch
    short = held < batch
    reached = not ends_here or (resume.remaining_steps or 0) + resume.step_in_epoch >= tail.optimizer_steps
    if replicas != dp and short and reached and plan.loss_reduction == "mean" and plan.tokens is None:
        out.append(
            f"each epoch's last optimizer step holds a short micro-batch ({held} of {batch} samples): "
            f"on {replicas} replicas its samples are the same but each replica's mean "
            f"over its short micro-batch weighs them otherwise than on {dp}, so that step's gradient "
            f"differs (loss_reduction sum, or a dataset that fills the step, keeps it)"
        )
    if replicas != dp:
        out.append(
            f"a loader's own saved state (torchdata's StatefulDataLoader, Accelerate's save_state with "
            f"use_stateful_dataloader) is each rank's position in its shard of {dp} replicas: on {replicas} "
            f"replicas the ranks and shards differ and that position is another block of the data. Skip "
            f"{resume.skip_micro_batches} micro-batches of the shard after sampler.set_epoch({resume.epoch}) "
            f"instead (docs/resume.md)"
        )
    return out


def resume_sentence(resume: ResumePlan) -> str:
    samples = (
        f"{resume.replica_groups[0].skip_samples} samples"
        if resume.micro_batch_size is not None
        else "of its own micro-batch size each"
    )
    skip = f"skips its first {resume.skip_micro_batches} micro-batches ({samples})"
    lr = ""
    if resume.lr is not None:
        lr = f"; the lr there is {resume.lr!r}, the schedule's step {resume.optimizer_step}"
    return (
        f"Resume at optimizer step {resume.optimizer_step} ({resume.consumed_samples} samples consumed): "
        f"epoch {resume.epoch}, step {resume.step_in_epoch} of it. On {resume.data_parallel_size} replicas "
        f"(micro-batch {resume.micro_batch_size} x accumulation {resume.gradient_accumulation_steps}), each "
        f"rank calls sampler.set_epoch({resume.epoch}) and {skip} of that epoch{lr}."
    )
