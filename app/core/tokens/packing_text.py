"""A packed or budgeted plan's warnings (where a tool's default is not the exact token mean, its
issue and the setting that makes it exact) and its sentence."""

from __future__ import annotations

from app.core.records.plan import Plan
from app.core.records.plan_request import PackingMode, PackingSpec, PlanRequest


def warnings(request: PlanRequest, plan: Plan) -> list[str]:
    packing = request.packing
    assert packing is not None
    dp = plan.data_parallel_size
    out = [
        "Hugging Face Trainer: exact with average_tokens_across_devices=True (the default since "
        "transformers#34242; False keeps each rank's own count, a mean of per-rank means) and a model "
        "whose forward takes num_items_in_batch (**kwargs) or a compute_loss_func; before transformers "
        "PR #46204 num_items_in_batch counted one target too many per row of a causal model",
        "Megatron-LM: by default (calculate_per_token_loss off) each micro-batch's loss is divided by its "
        "own token count and by the number of micro-batches, a mean of per-micro-batch means, exact only "
        "when every count is equal (Megatron-LM#4590); --calculate-per-token-loss back-propagates the sums "
        "and divides the gradients by the all-reduced count: exact",
    ]
    if packing.mode is PackingMode.ROWS:
        out.append(
            "packed rows under sdpa or eager attention: set use_cache=False in a custom loop (the Trainer "
            "does); a Llama config's default use_cache=True builds a cache even in training, which turns "
            "off the per-document mask from position_ids, and attention leaks across documents"
        )
    out += _torchtitan(plan, dp, request.parallelism.pipeline)
    if packing.mode is PackingMode.TOKEN_BUDGET:
        out += [
            "DeepSpeed's token-budget batching (PR #7104, data_sampling.dynamic_batching) keeps each "
            "micro-batch's mean loss and rescales the lr per step by its number of sequences: not the "
            "token-weighted gradient (targets within the step stay unequally weighted, sequences are "
            "counted instead of targets, and under Adam the step size changes instead); keep "
            "lr_scaling_method none and weight the loss as tokens.loss_scale_formula says",
            "ranks run different numbers of micro-batches: accumulate all but the last under DDP's "
            "no_sync and run exactly one synchronised backward a step (a rank with no sample runs one "
            "zero-weight micro-batch); an all-reduce per micro-batch hangs, and no_sync with DDP "
            "static_graph=True fails (pytorch#143580)",
        ]
    return out


def _torchtitan(plan: Plan, dp: int, pipeline: int) -> list[str]:
    mesh = plan.device_mesh
    out = []
    if mesh is not None and mesh.wrapper == "ddp" and dp > 1:
        out.append(
            "torchtitan 0.2.2 normalises by the global valid-token count (PR #2206, issue #1842), but "
            f"under pure DDP its replicate still averages: gradients {dp}x too small (torchtitan#2318); "
            "use data_parallel_shard (FSDP), or multiply the loss by the data-parallel size"
        )
    if pipeline > 1:
        out.append(
            "torchtitan 0.2.2 with pipeline parallelism back-propagates the summed loss without dividing "
            "by the global valid-token count: gradients N times too large (torchtitan#2972)"
        )
    return out


def sentence(packing: PackingSpec, seq: int, G: int, most_targets: int, most_micro: int) -> str:
    lengths = packing.document_length
    mean = lengths.mean if lengths is not None else None
    if packing.mode is PackingMode.ROWS:
        # Full rows of documents of mean length m cut at row ends: about seq / m documents start
        # in a row, plus the piece carried over from the row before; one target lost to each.
        # Never above the bound, which a row of the longest documents reaches.
        about = (
            f" (about {min(most_targets, round(G * (seq - seq / mean - 1)))} with documents of "
            f"{mean:g} tokens on average)"
            if mean is not None
            else ""
        )
        return (
            f"Packed rows: documents are packed into rows of {seq} positions, a document's first "
            f"position never a target, so a row holding d documents has {seq} - d targets: at most "
            f"{most_targets} a step{about}. Attention stays within each document: position_ids "
            "restart at each document (DataCollatorWithFlattening) and the attention reads the "
            "boundaries from them."
        )
    return (
        f"Token budget: each rank fills its micro-batches in order up to "
        f"{packing.max_tokens_per_micro_batch} tokens with samples of at most {seq}, so a rank runs "
        f"from 1 to {most_micro} micro-batches a step and the step holds at most {most_targets} "
        "targets; every target still weighs 1/N of the step."
    )
