"""What the commands print: the plan table, a finished check (each kind's lines from
check_lines.py), and text written to stdout or --output. Results go to stdout, everything else
to stderr; a command's errors are errors.py's."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from app.cli.check_lines import KIND_LINES
from app.cli.errors import fail
from app.cli.flag_names import suggestion_lines
from app.cli.law_table import law_lines
from app.cli.mesh_table import mesh_lines
from app.cli.stream_table import stream_lines
from app.cli.throughput_table import measured_lines
from app.client import Json


def table(result: Json) -> str:
    micro = result["micro_batch_size"]
    lines = [
        f"world size {result['world_size']}, model-parallel {result['model_parallel_size']}, "
        f"data-parallel {result['data_parallel_size']}",
        f"global batch {result['global_batch_size']}{_asked(result['requested_global_batch_size'])}, "
        f"micro {micro if micro is not None else 'per group'}, "
        f"accumulation {result['gradient_accumulation_steps']}",
        "",
        # Replica groups span data-parallel ranks: under model parallelism they are not the
        # global ranks of the mesh's rank map below.
        f"{'dp ranks':>15}  {'group':<12} {'micro':>6} {'per step':>9} {'loss scale':>11}",
    ]
    for g in result["replica_groups"]:
        ranks = f"{g['start']}-{g['stop'] - 1}"
        lines.append(
            f"{ranks:>15}  {g['node_group']:<12} {g['micro_batch_size']:>6} "
            f"{g['samples_per_step']:>9} "
            + (f"{g['loss_scale']:>11.6g}" if g["loss_scale"] is not None else f"{'per token':>11}")
        )
    if result.get("sampler"):
        s = result["sampler"]
        lines += [
            "",
            f"sampler {s['kind']}: {s['micro_steps_per_epoch']} micro-steps, "
            f"{s['optimizer_steps_per_epoch']} optimizer steps per epoch, "
            f"{s['padded_samples']} padded, {s['dropped_samples']} dropped",
        ]
    lines += stream_lines(result.get("stream"))
    if result.get("learning_rate"):
        lr = result["learning_rate"]
        lines.append(
            f"learning rate {lr['lr']:.6g} ({lr['rule']} x{lr['factor']:.6g}), "
            + (
                f"warmup {lr['warmup_steps']} steps from {lr['warmup_start_lr']:.6g}"
                if lr["warmup_steps"]
                else "no warmup"
            )
        )
    tokens = result.get("tokens")
    if tokens and tokens["sequence_length"] is not None:
        lines.append(
            f"tokens: sequence {tokens['sequence_length']}, {tokens['tokens_per_micro_batch']} per "
            f"micro-batch per replica, {tokens['tokens_per_step']} per step; loss normalised per "
            f"{tokens['loss_normalization']}"
        )
    if tokens and tokens.get("packing"):
        lines.append(
            f"packing: {tokens['packing']}, at most {tokens['max_valid_targets_per_step']} valid targets "
            f"and {tokens['max_micro_batches_per_step']} micro-batches per rank a step; loss: "
            f"{tokens['loss_scale_formula']}"
        )
    lines += measured_lines(result)
    lines += law_lines(result)
    lines += mesh_lines(result)
    lines += resume_lines(result.get("resume"))
    lines += ["", *(f"warning: {w}" for w in result["warnings"])]
    lines += [f"- {e}" for e in result["explanation"]]
    return "\n".join(lines).rstrip()


def _asked(requested: int | None) -> str:
    """The global batch the request asked for; none where it gave the micro-batch alone."""
    return "" if requested is None else f" (asked {requested})"


def resume_lines(resume: Json | None) -> list[str]:
    if not resume:
        return []
    micro = resume["micro_batch_size"] if resume["micro_batch_size"] is not None else "per group"
    lines = [
        "",
        f"resume at step {resume['optimizer_step']} ({resume['consumed_samples']} samples): epoch "
        f"{resume['epoch']}, step {resume['step_in_epoch']} of it, on {resume['data_parallel_size']} "
        f"replicas (micro {micro}, "
        f"accumulation {resume['gradient_accumulation_steps']})",
        f"{'dp ranks':>15}  {'skip micro-batches':>18} {'skip samples':>13}",
    ]
    for g in resume["replica_groups"]:
        ranks = f"{g['start']}-{g['stop'] - 1}"
        lines.append(f"{ranks:>15}  {g['skip_micro_batches']:>18} {g['skip_samples']:>13}")
    lr = f"lr there {resume['lr']:.6g}; " if resume["lr"] is not None else ""
    same = "yes" if resume["same_global_batches"] else f"no: {resume['why']}"
    lines.append(f"{lr}the uninterrupted run's global batches: {same}")
    lines += [f"  exact with {line}" for line in suggestion_lines(resume.get("suggestions") or {})]
    return lines


def emit(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    try:
        output.write_text(text if text.endswith("\n") else text + "\n")
    except OSError as err:
        fail({"detail": f"cannot write {output}: {err.strerror or err}"})
    typer.echo(f"wrote {output}", err=True)


def show_check(job: Json, as_json: bool) -> int:
    """Print a finished check; the exit status: 0 passed, 1 ran and failed (or its lr-scaling
    probe found that the plan's own lr rule does not hold), 2 did not run."""
    result = job.get("result") if job.get("status") == "succeeded" else None
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    if not isinstance(result, dict):
        typer.echo(
            f"error: check {job.get('id')} {job.get('status')}: {job.get('error') or 'no result'}", err=True
        )
        return 2
    passed = bool(result.get("passed"))
    if not as_json:
        held = result["rel_l2"] <= result["tolerance"]
        lines = [
            f"{'PASSED' if passed else 'FAILED'}: the DDP gradient "
            f"{'matches' if held else 'does NOT match'} the single-process gradient of the global batch",
            f"  rel_l2 {result['rel_l2']:.3g} (tolerance {result['tolerance']:.3g}), "
            f"max abs diff {result['max_abs_diff']:.3g}",
            f"  {result['backend']} on {result['device']}: {result['processes']} processes for "
            f"{result['data_parallel_size']} replicas ({result['replicas_per_process']} per process), "
            f"workload {_workload(result)}",
            *(line for lines in KIND_LINES for line in lines(result)),
            "controls (wrong setups the check must tell apart):",
            *_control_lines(result),
            *_model_lines(result),
            *(f"warning: {w}" for w in result.get("warnings") or []),
        ]
        typer.echo("\n".join(line.rstrip() for line in lines))
    probe = result.get("lr_scaling")
    if isinstance(probe, dict) and probe.get("plan_rule_holds") is False:
        # CI gates on the exit status: a plan whose lr rule the probe refutes is not one to train.
        typer.echo(
            f"error: the plan's lr rule ({probe.get('plan_rule')}) does not hold in the probe "
            f"(best: {probe.get('best_rule')}): exit status 1",
            err=True,
        )
        return 1
    return 0 if passed else 1


def _control_lines(result: Json) -> list[str]:
    """The controls that ran, with their verdicts, and those that did not apply, with why."""
    lines = []
    for c in result.get("controls", []):
        seen = "detected" if c.get("detected") else "MISSED"
        error = "hung (detected)" if c.get("hung") else f"rel_l2 {c['rel_l2']:<10.3g}"
        lines.append(f"  {seen:<9} {c['name']:<28} {error} {c.get('description', '')}")
    skipped = result.get("controls_skipped")
    if not isinstance(skipped, list):  # a worker from before the reasons: the names alone
        skipped = [{"name": name} for name in result.get("controls_not_applicable") or []]
    for c in skipped:
        reason = c.get("reason") or "does not apply to this plan"
        lines.append(f"  {'skipped':<9} {c.get('name')!s:<28} {reason}")
    if not lines:
        lines.append("  (none applies to this plan)")
    return lines


def _workload(result: Json) -> str:
    """What the check trained: a factory's `module:function` or registered name, else the
    built-in workload (synthetic, tokens)."""
    model = result.get("model")
    return str(model) if model and model != "synthetic" else str(result.get("workload") or "synthetic")


def _model_lines(result: Json) -> list[str]:
    """The model's DDP equivalence, its noise scale and the micro-batch search, when present."""
    lines: list[str] = []
    equivalence = result.get("ddp_equivalence")
    if isinstance(equivalence, dict):
        lines.append(f"model {result.get('model', 'synthetic')}: {equivalence['summary']}")
        for finding in equivalence.get("findings", []):
            mark = "breaks" if finding["breaks_equivalence"] else "note"
            where = f" ({', '.join(finding['modules'])})" if finding.get("modules") else ""
            lines.append(f"  {mark:<6} {finding['cause']}{where}: {finding['detail']}")
            lines.append(f"         fix: {finding['fix']}")
    noise = result.get("noise_scale")
    if isinstance(noise, dict):
        value = noise.get("b_simple")
        spread = f" +/- {noise['stderr']:.3g}" if noise.get("stderr") is not None else ""
        shown = f"{value:.4g}{spread} samples" if value is not None else "not measurable"
        lines.append(f"gradient noise scale B_simple: {shown} over {noise['steps']} steps")
        lines.append(f"  {noise['recommendation']}")
    search = result.get("micro_batch_search")
    if isinstance(search, dict):
        planned = search["planned"]
        lines.append(
            f"largest micro-batch that fits: {search['max_micro_batch_size']}"
            f"{' (the search limit)' if search.get('hit_limit') else ''}, {_memory(search)}; "
            f"planned micro-batch {planned['micro_batch_sizes']} x "
            f"{planned['gradient_accumulation_steps']} accumulation steps for global batch "
            f"{planned['global_batch_size']}"
        )
    return lines


def _memory(search: Json) -> str:
    """What the found micro-batch's step used, and the budget it had to fit: the memory less
    the safety margin, which is not what was used."""
    used = search.get("peak_bytes_at_max")
    peak = f"peak {used:,} of {search['capacity_bytes']:,} bytes" if used is not None else "peak not measured"
    margin = search.get("safety_margin")
    shown = f" after the {margin * 100:g}% safety margin" if isinstance(margin, (int, float)) else ""
    return f"{peak} (budget {search['budget_bytes']:,} bytes{shown})"
