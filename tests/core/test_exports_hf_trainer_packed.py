"""The hf-trainer export of packed rows, run by transformers' own Trainer (CPU, one process, a
tiny random Llama): over several optimizer steps the `num_items_in_batch` the Trainer computes
from the exported collator and arguments is the step's valid-target count as the plan counts it
(a row of sequence_length positions holding d documents has sequence_length - d targets), within
the plan's bound; a token budget, which the Trainer cannot run, is refused at /packing/mode."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from support.parallel import IN_PROCESS_TRAINERS

from app.core.errors.domain import InvalidValue
from app.core.exports.parts.export_types import ExportInput, ExportOptions
from app.core.exports.registry import export, plan_and_export
from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn

SEQ, STEPS = 16, 3
ROWS: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 1},
    "global_batch_size": 6,
    "micro_batch_size": 2,
    "sequence_length": SEQ,
    "loss_normalization": "token",
    "packing": {"mode": "rows", "document_length": {"max": 7}},
    "learning_rate": {"base_lr": 0.05, "base_batch_size": 6},
}


def _documents(total: int) -> list[list[int]]:
    """Seeded documents of 2 to 7 tokens, `total` tokens in all (the last one cut to fit)."""
    generator, docs, left = random.Random(7), [], total
    while left:
        length = min(generator.randint(2, 7), left)
        docs.append([generator.randint(1, 31) for _ in range(length)])
        left -= length
    return docs


@pytest.mark.slow  # transformers takes seconds to import; the 3 steps well under a second
@IN_PROCESS_TRAINERS
def test_the_trainers_num_items_in_batch_is_the_plans_target_count(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    request = PlanRequestIn.model_validate(ROWS).to_core()
    planned = plan(request)
    assert planned.tokens is not None
    text = export("hf-trainer", ExportInput(request, planned)).text
    text = text.replace('output_dir="batchplan"', f"output_dir={str(tmp_path)!r}")
    namespace: dict[str, Any] = {"__name__": "training_args"}
    exec(compile(text, "training_args.py", "exec"), namespace)
    args = namespace["training_args"]
    args.max_steps, args.save_strategy = STEPS, "no"
    per_step = ROWS["micro_batch_size"] * planned.gradient_accumulation_steps
    rows = namespace["pack_rows"](_documents(STEPS * per_step * SEQ))
    assert len(rows) == STEPS * per_step and all(sum(map(len, row)) == SEQ for row in rows)

    seen: list[float] = []

    plan_trainer: Any = namespace["PlanTrainer"]

    class Recording(plan_trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, **kwargs: Any) -> Any:
            seen.append(float(kwargs["num_items_in_batch"]))
            return super().compute_loss(model, inputs, **kwargs)

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    trainer = Recording(model=model, args=args, train_dataset=rows)
    assert isinstance(trainer.data_collator, namespace["PackedRowsCollator"])
    assert model.config.use_cache is False  # sdpa keeps to each document only without a cache
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared, busy host: many times faster
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)

    # The plan's sampler order: a step is gradient_accumulation_steps micro-batches of rows.
    sampler = torch.utils.data.DistributedSampler(rows, num_replicas=1, rank=0, shuffle=True, seed=0)
    sampler.set_epoch(0)
    order = list(sampler)
    expected = [
        sum(SEQ - len(rows[i]) for i in order[k * per_step : (k + 1) * per_step]) for k in range(STEPS)
    ]
    accumulation = planned.gradient_accumulation_steps
    # compute_loss sees the step's count at each of its micro-batches.
    assert seen == [n for n in expected for _ in range(accumulation)], (seen, expected)
    bound = planned.tokens.max_valid_targets_per_step
    assert bound is not None and len(set(expected)) > 1 and max(expected) <= bound


def test_a_token_budget_is_refused_for_the_trainer() -> None:
    budget = {**ROWS, "packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 32}}
    request = PlanRequestIn.model_validate(budget).to_core()
    with pytest.raises(InvalidValue, match="no token-budget batching") as caught:
        plan_and_export("hf-trainer", request, ExportOptions())
    assert caught.value.pointer == "/packing/mode"
    with pytest.raises(InvalidValue, match="no token-budget batching"):
        export("hf-trainer", ExportInput(request, plan(request)))
