"""Plans in tokens against an independent re-statement of torchtitan's rule (torchtitan 0.2.2,
`torchtitan/train.py`, Trainer.__init__): a global batch of `global_batch_size` sequences of
`seq_len` tokens, `local_batch_size` sequences per micro-batch per data-parallel rank, and

    global_batch_size % (local_batch_size * dp_degree) == 0  (else an AssertionError)
    gradient_accumulation_steps = global_batch_size // (local_batch_size * dp_degree)

where dp_degree is the batch mesh, dp_replicate x dp_shard (parallel_dims.py). A request that
torchtitan would refuse is a 422 naming the token field, with suggestions that plan."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors.domain import PlanError
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.request.parse import plan_request


def torchtitan_accumulation(global_batch_size: int, local_batch_size: int, dp_degree: int) -> int | None:
    """torchtitan's accumulation steps, or None where its assertion refuses the config."""
    if global_batch_size < 0:  # its default: one micro-batch per rank
        global_batch_size = local_batch_size * dp_degree
    if global_batch_size % (local_batch_size * dp_degree):
        return None
    return global_batch_size // (local_batch_size * dp_degree)


def _plan(body: dict[str, Any]) -> Plan:
    return plan(plan_request(body))


def _body(gpus: int, tensor: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": gpus},
        "parallelism": {"tensor": tensor},
        "sequence_length": seq,
        **fields,
    }


@settings(max_examples=150, deadline=None)
@given(
    dp=st.integers(1, 16),
    tensor=st.sampled_from([1, 2, 4]),
    seq=st.integers(1, 8192),
    local=st.integers(1, 16),
    steps=st.integers(-1, 12),  # -1: torchtitan's default global batch
)
def test_token_plans_match_torchtitans_rule(dp: int, tensor: int, seq: int, local: int, steps: int) -> None:
    global_sequences = -1 if steps <= 0 else local * dp * steps
    expected = torchtitan_accumulation(global_sequences, local, dp)
    assert expected is not None
    tokens = (local * dp * expected) * seq
    p = _plan(_body(dp * tensor, tensor, seq, global_batch_tokens=tokens, micro_batch_tokens=local * seq))
    assert p.data_parallel_size == dp
    assert p.gradient_accumulation_steps == expected
    assert p.micro_batch_size == local
    assert p.tokens is not None and p.tokens.unit == "tokens"
    assert p.tokens.tokens_per_micro_batch == local * seq  # torchtitan: local_batch_size x seq_len
    assert p.tokens.tokens_per_step == tokens == p.global_batch_size * seq


@settings(max_examples=150, deadline=None)
@given(
    dp=st.integers(1, 8),
    seq=st.integers(1, 4096),
    local=st.integers(1, 8),
    global_sequences=st.integers(1, 200),
)
def test_steps_torchtitan_refuses_are_422s_naming_the_token_field(
    dp: int, seq: int, local: int, global_sequences: int
) -> None:
    body = _body(dp, 1, seq, global_batch_tokens=global_sequences * seq, micro_batch_tokens=local * seq)
    expected = torchtitan_accumulation(global_sequences, local, dp)
    if expected is not None:
        assert _plan(body).gradient_accumulation_steps == expected
        return
    with pytest.raises(PlanError) as caught:
        _plan(body)
    err = caught.value
    assert err.pointer == "/global_batch_tokens"
    assert "global_batch_tokens" in err.detail
    suggested = err.suggestions["global_batch_tokens"]
    assert suggested
    for tokens in suggested:  # each suggestion works, and torchtitan takes it too
        fixed = _plan({**body, "global_batch_tokens": tokens})
        assert torchtitan_accumulation(tokens // seq, local, dp) == fixed.gradient_accumulation_steps


@settings(max_examples=100, deadline=None)
@given(seq=st.integers(2, 4096), sequences=st.integers(1, 1000), extra=st.data())
def test_token_counts_that_are_not_whole_sequences_are_refused(
    seq: int, sequences: int, extra: st.DataObject
) -> None:
    off = extra.draw(st.integers(1, seq - 1))
    for name in ("global_batch_tokens", "micro_batch_tokens"):
        body = _body(1, 1, seq, **{name: sequences * seq + off})
        with pytest.raises(PlanError) as caught:
            _plan(body)
        assert caught.value.pointer == f"/{name}"
        # One GPU: every whole number of sequences plans, so both neighbours are suggested.
        assert sorted(caught.value.suggestions[name]) == [sequences * seq, (sequences + 1) * seq]
        assert all(v % seq == 0 for v in caught.value.suggestions[name])


def test_token_fields_need_a_sequence_length_and_exclude_the_sample_fields() -> None:
    top = {"topology": {"num_nodes": 1, "gpus_per_node": 2}}
    with pytest.raises(PlanError) as caught:
        _plan({**top, "global_batch_tokens": 4096})
    assert caught.value.pointer == "/sequence_length"
    with pytest.raises(PlanError) as caught:
        _plan({**top, "sequence_length": 512, "global_batch_tokens": 4096, "global_batch_size": 8})
    assert caught.value.pointer == "/global_batch_tokens"
    with pytest.raises(PlanError) as caught:
        _plan({**top, "global_batch_size": 8, "learning_rate": {"base_lr": 0.1, "base_batch_tokens": 1024}})
    assert caught.value.pointer == "/sequence_length"


def test_a_plan_in_samples_with_a_sequence_length_reports_tokens() -> None:
    p = _plan(_body(8, 1, 1000, global_batch_size=64, dataset={"num_samples": 1000}))
    assert p.tokens is not None and p.tokens.unit == "samples"
    assert p.tokens.tokens_per_step == 64 * 1000
    assert p.tokens.tokens_per_micro_batch == (p.micro_batch_size or 0) * 1000
    assert p.sampler is not None
    # The sampler's epoch: DistributedSampler pads 1000 samples to 1000 (8 x 125 per replica),
    # read in micro-steps of 64.
    assert p.tokens.tokens_per_epoch == p.sampler.micro_steps_per_epoch * 64 * 1000
    assert p.tokens.loss_normalization == "sample" and p.tokens.loss_scale_formula is None
    assert any("loss_normalization is sample" in w for w in p.warnings)
    assert p.replica_groups[0].loss_scale == 1.0
    assert _plan({"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}).tokens is None


def test_token_normalisation_states_the_formula_with_this_plans_numbers() -> None:
    p = _plan(
        _body(8, 2, 2048, global_batch_tokens=2048 * 64, micro_batch_tokens=4096, loss_normalization="token")
    )
    assert (p.data_parallel_size, p.gradient_accumulation_steps) == (4, 8)
    assert all(g.loss_scale is None for g in p.replica_groups)
    assert p.tokens is not None and p.tokens.loss_scale_formula is not None
    assert "x 4 (data_parallel_size)" in p.tokens.loss_scale_formula
    sentence = next(line for line in p.explanation if line.startswith("Token-normalised"))
    assert "8 micro-batches of all 4 replicas" in sentence and "multiplies by 4" in sentence
    assert not any("loss_scale" in line for line in p.explanation)


def test_the_learning_rate_scales_against_tokens_with_base_batch_tokens() -> None:
    lr = {"base_lr": 0.001, "base_batch_tokens": 2**20, "rule": "linear", "optimizer": "sgd"}
    p = _plan(_body(4, 1, 4096, global_batch_tokens=2**22, learning_rate=lr))
    assert p.learning_rate is not None and p.learning_rate.base_batch_tokens == 2**20
    assert p.learning_rate.factor == 2**22 / 2**20
    assert p.learning_rate.lr == 0.001 * 4
    assert any(f"{2**22}/{2**20} tokens" in line for line in p.explanation)


def test_a_short_last_micro_batch_is_reported_in_tokens() -> None:
    p = _plan(_body(2, 1, 100, global_batch_size=8, micro_batch_size=4, dataset={"num_samples": 10}))
    assert any("holds 100 of 400 tokens per replica" in w for w in p.warnings)
