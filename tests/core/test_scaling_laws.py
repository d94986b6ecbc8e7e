"""The scaling laws a plan's `recommend` takes its batch and lr from, held to the papers: the
formulas as printed (written out again here, not imported), N and M from an architecture
against the papers' own worked values, Step Law's prediction through the planner against the
authors' released grid of runs, and DeepSeek's 7B and 67B settings against DeepSeek's law."""

from __future__ import annotations

import csv
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from app.core.learning_rate import model_counts, scaling_laws
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.records.recommendation import Architecture
from app.core.request.parse import plan_request

GRID = Path(__file__).resolve().parents[1] / "data" / "steplaw_grid.csv"
BAND = 0.0025  # the authors' near-optimal band: +0.25% of the point's best smoothed loss


# The papers' formulas, typed from them: Step Law (arXiv:2503.04715) and DeepSeek LLM
# (arXiv:2401.02954, eq. 1 and eq. 2).
def step_lr(n: float, d: float) -> float:
    return 1.79 * n**-0.713 * d**0.307


def step_batch(d: float) -> float:
    return 0.58 * d**0.571


def deepseek_lr(c: float) -> float:
    return 0.3118 * c**-0.1250


def deepseek_batch(c: float) -> float:
    return 0.2920 * c**0.3271


def eq2(layers: int, d: int, seq: int) -> int:
    return 72 * layers * d * d + 12 * layers * d * seq


def _planned(body: dict[str, Any]) -> Plan:
    return plan(plan_request(body))


def _request(recommend: dict[str, Any], gpus: int = 8, seq: int = 2048, **rest: Any) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": gpus},
        "sequence_length": seq,
        "recommend": recommend,
        **rest,
    }


# ----------------------------------------------------------------------------- the formulas


def test_the_laws_are_the_published_formulas_over_random_models() -> None:
    rng = random.Random(50)
    for _ in range(500):
        n = rng.randint(10**6, 10**13)
        d = rng.randint(10**8, 10**14)
        m = rng.uniform(1e6, 1e13)
        assert math.isclose(scaling_laws.step_law_lr(n, d), step_lr(n, d), rel_tol=1e-9)
        assert math.isclose(scaling_laws.step_law_batch_tokens(d), step_batch(d), rel_tol=1e-9)
        assert math.isclose(scaling_laws.deepseek_lr(m * d), deepseek_lr(m * d), rel_tol=1e-9)
        assert math.isclose(scaling_laws.deepseek_batch_tokens(m * d), deepseek_batch(m * d), rel_tol=1e-9)


def test_the_plans_recommendation_carries_the_formulas_numbers() -> None:
    rng = random.Random(51)
    for _ in range(12):
        n, d, m = rng.randint(10**7, 10**11), rng.randint(10**9, 10**13), float(rng.randint(10**8, 10**12))
        step = _planned(_request({"law": "step_law", "non_embedding_params": n, "train_tokens": d}))
        ds = _planned(_request({"law": "deepseek", "flops_per_token": m, "train_tokens": d}))
        assert step.recommendation is not None and ds.recommendation is not None
        assert math.isclose(step.recommendation.lr, step_lr(n, d), rel_tol=1e-9)
        assert math.isclose(step.recommendation.batch_tokens, step_batch(d), rel_tol=1e-9)
        assert math.isclose(ds.recommendation.lr, deepseek_lr(m * d), rel_tol=1e-9)
        assert math.isclose(ds.recommendation.batch_tokens, deepseek_batch(m * d), rel_tol=1e-9)
        # The law's lr is what the plan runs when the request gives none (rule none).
        assert step.learning_rate is not None and step.learning_rate.lr == step.recommendation.lr
        assert step.learning_rate.decay == "cosine" and step.learning_rate.min_lr == min(1e-5, step_lr(n, d))


# ----------------------------------------------------------------------------- N and M


# Step Law's five dense shapes (h, ffn, heads, layers) and N as its released grid gives it.
STEP_LAW_SHAPES = [
    (960, 9368, 15, 7, 214_663_680),
    (1024, 9552, 16, 8, 268_304_384),
    (1280, 9472, 10, 10, 429_260_800),
    (1280, 9048, 10, 13, 536_872_960),
    (2048, 8192, 16, 16, 1_073_741_824),
]


@pytest.mark.parametrize(("h", "ffn", "heads", "layers", "n"), STEP_LAW_SHAPES)
def test_step_laws_n_for_its_grid_shapes(h: int, ffn: int, heads: int, layers: int, n: int) -> None:
    arch = Architecture(layers=layers, hidden_size=h, ffn_hidden_size=ffn, num_heads=heads)
    assert model_counts.non_embedding_params(arch) == n
    # The authors' fit_tool.py counts M as 6 (4h + 3 ffn + 2 seq) layers h.
    assert model_counts.flops_per_token(arch, 2048) == 6 * (4 * h + 3 * ffn + 2 * 2048) * layers * h


# DeepSeek LLM's Table 3 (n_vocab 102400, l_seq 4096): layers, d_model, N1 and 6N1/M as printed.
DEEPSEEK_TABLE_3 = [
    (8, 512, 25_165_824, 0.43),
    (12, 768, 84_934_656, 0.53),
    (24, 1024, 301_989_888, 0.60),
    (24, 2048, 1_207_959_552, 0.75),
    (32, 4096, 6_442_450_944, 0.85),
    (40, 5120, 12_582_912_000, 0.88),
    (80, 8192, 64_424_509_440, 0.92),
]


@pytest.mark.parametrize(("layers", "d", "n1", "ratio"), DEEPSEEK_TABLE_3)
def test_deepseeks_m_for_its_table_3(layers: int, d: int, n1: int, ratio: float) -> None:
    # Their blocks: multi-head attention and 8 d^2 FFN weights (a plain FFN of 4d here).
    arch = Architecture(
        layers=layers, hidden_size=d, ffn_hidden_size=4 * d, num_heads=d // 64, gated_ffn=False
    )
    m = model_counts.flops_per_token(arch, 4096)
    assert model_counts.non_embedding_params(arch) == n1
    assert m == eq2(layers, d, 4096) == model_counts.deepseek_eq2(layers, d, 4096)
    assert abs(6 * n1 / m - ratio) < 0.01  # the table prints two digits (0.857 as 0.85)
    # The same with their gated FFN of 8d/3 where it is whole.
    if 8 * d % 3 == 0:
        gated = Architecture(layers=layers, hidden_size=d, ffn_hidden_size=8 * d // 3, num_heads=d // 64)
        assert model_counts.flops_per_token(gated, 4096) == m


def test_the_first_table_3_row_as_printed() -> None:
    arch = Architecture(layers=8, hidden_size=512, ffn_hidden_size=2048, num_heads=8, gated_ffn=False)
    assert round(model_counts.non_embedding_params(arch) / 1e6, 1) == 25.2  # "25.2M"
    assert round(model_counts.flops_per_token(arch, 4096) / 1e6) == 352  # "352M"


def test_grouped_query_attention_counts_fewer_key_value_weights() -> None:
    mha = Architecture(layers=95, hidden_size=8192, ffn_hidden_size=22016, num_heads=64)
    gqa = Architecture(layers=95, hidden_size=8192, ffn_hidden_size=22016, num_heads=64, num_kv_heads=8)
    saved = 95 * 2 * 8192 * (64 - 8) * 128
    assert model_counts.non_embedding_params(mha) - model_counts.non_embedding_params(gqa) == saved
    assert model_counts.non_embedding_params(gqa) == 65_745_715_200


# ----------------------------------------------------------------------------- the released grid


def _grid() -> dict[tuple[int, int], list[tuple[float, int, float]]]:
    points: dict[tuple[int, int], list[tuple[float, int, float]]] = defaultdict(list)
    with GRID.open(newline="") as f:
        for row in csv.DictReader(f):
            points[int(row["N"]), int(row["D"])].append(
                (float(row["lr"]), int(row["batch_tokens"]), float(row["smooth_loss"]))
            )
    return points


def test_the_plan_lands_in_the_authors_near_optimal_band_on_their_grid() -> None:
    """At each of the grid's 17 (N, D) points, Step Law through the planner on one node of 8
    GPUs (sequences of 2048, the grid's): the run nearest to the plan's (lr,
    planned_batch_tokens), in log lr and log batch, against the point's best smoothed loss.
    The law's own numbers hit 16 of 17 (the miss, 214.7M / 20B, is +0.31%). At least 15 are
    asked for: the plan's batch moves from the law's by up to 8 sequences (up to 2.2% here),
    which can carry the nearest run across a grid midpoint, as snapping each axis to the grid
    does at one point of the 17 (15 of 17)."""
    points = _grid()
    assert len(points) == 17 and sum(len(runs) for runs in points.values()) == 1911
    hits, report = 0, []
    for (n, d), runs in sorted(points.items()):
        planned = _planned(_request({"law": "step_law", "non_embedding_params": n, "train_tokens": d}))
        rec, lr = planned.recommendation, planned.learning_rate
        assert rec is not None and lr is not None and rec.planned_batch_tokens is not None
        assert rec.within_fit and abs(rec.planned_vs_law_percent or 0) < 2.5
        assert planned.global_batch_size * 2048 == rec.planned_batch_tokens
        best = min(loss for _, _, loss in runs)
        x, y = math.log2(lr.lr), math.log2(rec.planned_batch_tokens)
        near = min(runs, key=lambda r: (math.log2(r[0]) - x) ** 2 + (math.log2(r[1]) - y) ** 2)
        above = near[2] / best - 1
        hits += above < BAND
        report.append(f"N {n} D {d}: nearest run +{100 * above:.3f}%")
    assert hits >= 15, "\n".join(report)


# ----------------------------------------------------------------------------- DeepSeek's own models


# DeepSeek LLM Table 2: layers, d_model, heads, kv heads, FFN (HF configs), batch in sequences of 4096, lr.
DEEPSEEK_MODELS = {
    "7B": (30, 4096, 32, 32, 11008, 2304, 4.2e-4),
    "67B": (95, 8192, 64, 8, 22016, 4608, 3.2e-4),
}


@pytest.mark.parametrize("name", DEEPSEEK_MODELS)
def test_deepseeks_7b_and_67b_settings_sit_on_their_law(name: str) -> None:
    """Within the precision the paper's own check shows: its models sit near the fitted lines
    (1% and 3% from the law's lr, 2% and 9% from its batch, which DeepSeek rounded to multiples of
    256 sequences): 3% in lr and 10% in batch, with the paper's M (eq. 2) given as flops_per_token.
    The architecture's own count (grouped-query attention, the real FFN) lands within the same."""
    layers, d, heads, kv, ffn, batch_seq, lr = DEEPSEEK_MODELS[name]
    d_tokens = 2 * 10**12
    arch = {
        "layers": layers,
        "hidden_size": d,
        "ffn_hidden_size": ffn,
        "num_heads": heads,
        "num_kv_heads": kv,
    }
    for recommend in (
        {"law": "deepseek", "train_tokens": d_tokens, "flops_per_token": eq2(layers, d, 4096)},
        {"law": "deepseek", "train_tokens": d_tokens, "architecture": arch},
    ):
        planned = _planned(_request(recommend, gpus=8, seq=4096))
        rec = planned.recommendation
        assert rec is not None
        assert abs(lr / rec.lr - 1) < 0.03, (recommend, rec.lr)
        assert abs(batch_seq * 4096 / rec.batch_tokens - 1) < 0.10, (recommend, rec.batch_tokens)
    # The paper's convention exactly: C = eq. (2)'s M x D, and the numbers worked in the paper's terms.
    c = eq2(layers, d, 4096) * d_tokens
    assert math.isclose(deepseek_lr(c), 0.3118 * c**-0.125, rel_tol=1e-12)


def test_deepseeks_worked_budgets() -> None:
    # C = 1e17 and 1e20, the paper's fit and its check: lr 2.338e-3 and 9.860e-4, batch 1.062e5
    # and 1.017e6 tokens.
    assert math.isclose(scaling_laws.deepseek_lr(1e17), 2.338e-3, rel_tol=1e-3)
    assert math.isclose(scaling_laws.deepseek_batch_tokens(1e17), 1.062e5, rel_tol=1e-3)
    assert math.isclose(scaling_laws.deepseek_lr(1e20), 9.860e-4, rel_tol=1e-3)
    assert math.isclose(scaling_laws.deepseek_batch_tokens(1e20), 1.017e6, rel_tol=1e-3)
