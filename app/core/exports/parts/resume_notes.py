"""What the trainer exports (hf-trainer, accelerate, lightning) say about a resume, when the plan
request has one: how to resume exactly in that tool with the plan's resume (its micro-batch,
accumulation and skip on the new data-parallel size), or what the tool does wrong and what to
set, with the tool's issue. Comment lines only: the tools' own code paths are the other
exports' business (docs/resume.md has the arithmetic and the traps).
"""

from __future__ import annotations

from app.core.exports.parts.export_types import ExportInput
from app.core.records.resume import ResumePlan


def _head(r: ResumePlan) -> str:
    exact = (
        "every later step then sees the uninterrupted run's global batch"
        if r.same_global_batches
        else f"the run is not the uninterrupted run from the epoch's end on ({r.why})"
    )
    return (
        f"Resume (the plan's resume): step {r.optimizer_step}, epoch {r.epoch} step {r.step_in_epoch} of "
        f"it, on {r.data_parallel_size} processes with micro-batch {r.micro_batch_size} x accumulation "
        f"{r.gradient_accumulation_steps}: each skips {r.skip_micro_batches} micro-batches of its shard "
        f"after sampler.set_epoch({r.epoch}); {exact}."
    )


def _hf_trainer(r: ResumePlan) -> list[str]:
    return [
        f"  HF Trainer: set per_device_train_batch_size={r.micro_batch_size} and "
        f"gradient_accumulation_steps={r.gradient_accumulation_steps} (they keep the global batch on "
        f"{r.data_parallel_size} processes) and call trainer.train(resume_from_checkpoint=...). The "
        "Trainer skips (global_step % steps_per_epoch) x "
        "gradient_accumulation_steps micro-batches and counts epochs with the new size's steps per epoch: "
        "the plan's skip where the epoch ends alike (same_global_batches). Leave ignore_data_skip False: "
        "True restarts the epoch's data. transformers#14554: the Trainer crashed loading the RNG states of "
        "GPUs the run no longer had; 5.24 logs the missing files and goes on.",
    ]


def _accelerate(r: ResumePlan) -> list[str]:
    return [
        "  Accelerate: after accelerator.load_state(checkpoint_dir), in train() for the resumed epoch only: "
        f"sampler.set_epoch({r.epoch}); loader = accelerator.skip_first_batches(loader, "
        f"{r.skip_micro_batches}), on the loader over the plan's sampler (not one accelerator.prepare "
        "split, whose count means another block of the data on another number of processes). "
        "accelerate#2016: load_state on more processes than saved finds no RNG file for the new ones and "
        "goes on without saying so (a logger.info).",
    ]


def _lightning(r: ResumePlan) -> list[str]:
    return [
        "  Lightning: resumed mid-epoch (trainer.fit(ckpt_path=...)) with a loader that has no "
        "state_dict, it warns and skips no data: its counters go on mid-epoch, the loader from the "
        f"epoch's start. Skip in plan_train_dataloader's sampler instead: after set_epoch({r.epoch}), "
        f"drop its first {r.skip_micro_batches * (r.micro_batch_size or 1)} indices "
        f"({r.skip_micro_batches} micro-batches of {r.micro_batch_size}) in the resumed epoch, or checkpoint "
        "at epoch ends only (ModelCheckpoint(save_on_train_epoch_end=True, every_n_epochs=1)).",
    ]


_TOOLS = {"hf-trainer": _hf_trainer, "accelerate": _accelerate, "lightning": _lightning}


def resume_notes(x: ExportInput, tool: str) -> list[str]:
    """The comment lines about the plan's resume in `tool`; none without a resume."""
    r = x.plan.resume
    if r is None:
        return []
    return [_head(r), *_TOOLS[tool](r)]
