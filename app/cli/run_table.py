"""What `batchplan check --steps N` adds to a check's output: a short per-step table of the run
against the reference run, and a resume's lines within it (its chart: charts.py)."""

from __future__ import annotations

from app.client import Json

# Steps shown at each end of a longer run.
SHOWN = 5


def run_lines(result: Json) -> list[str]:
    """The run's verdict and its steps (the first and last few of a long one); none for one step."""
    trajectory = result.get("trajectory")
    if not isinstance(trajectory, list) or not trajectory:
        return []
    held = "matches" if result.get("trajectory_matches") else "does NOT match"
    end = result.get("epoch_end") or {}
    lines = [
        f"the run of {result['steps']} optimizer steps {held} the single-process reference run: "
        f"parameters {result['final_params_rel_l2']:.3g} apart at the end "
        f"(tolerance {result['run_tolerance']:.3g} a step)",
        f"  {end.get('epochs_run')} epochs of {end.get('optimizer_steps_per_epoch')} optimizer steps; "
        f"leftover micro-steps per epoch: {end.get('leftover_micro_steps')} ({end.get('leftover')})",
        f"  {'step':>5} {'epoch':>5} {'lr':>11} {'loss':>13} {'reference':>13} {'params rel_l2':>13}",
    ]
    lines[2:2] = resumed_lines(result.get("resume"))  # before the steps' header
    shown = trajectory if len(trajectory) <= 2 * SHOWN else [*trajectory[:SHOWN], None, *trajectory[-SHOWN:]]
    for step in shown:
        if step is None:
            lines.append(f"  {'...':>5}")
            continue
        mark = "" if step.get("within_tolerance", True) else "  <- off"
        lines.append(
            f"  {step['step']:>5} {step['epoch']:>5} {step['lr']:>11.5g} {step['loss']:>13.8g} "
            f"{step['reference_loss']:>13.8g} {step['params_rel_l2']:>13.3g}{mark}"
        )
    return lines


def resumed_lines(resume: Json | None) -> list[str]:
    """A resume check's resume: the checkpoint, the replicas after it, where each group resumed."""
    if not isinstance(resume, dict):
        return []
    held = "matches" if resume["matches"] else "does NOT match"
    lines = [
        f"  resumed at step {resume['at_step']} (epoch {resume['epoch']}, step {resume['step_in_epoch']} of "
        f"it): {resume['data_parallel_size_before']} -> {resume['data_parallel_size_after']} replicas, "
        f"micro-batch {resume['micro_batch_size']} x accumulation {resume['gradient_accumulation_steps']}; "
        f"from there the run {held} the uninterrupted reference",
    ]
    for group in resume["replica_groups"]:
        lines.append(
            f"    replicas {group['start']}-{group['stop'] - 1}: set_epoch({resume['epoch']}), skip "
            f"{group['skip_micro_batches']} micro-batches ({group['skip_samples']} samples)"
        )
    lines.append(f"    checkpoint: {resume['checkpoint']}")
    return lines
