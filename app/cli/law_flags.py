"""The flags of a scaling law's recommendation (`plan` and `export`: the request's `recommend`,
docs/recommend.md), declared once as a flag group (flag_groups.py), and the request they add.

Counts are read as numbers, so that `--params 1.2e9` and `--train-tokens 1e11` work; a whole
number is sent as one, anything else as it is, for the schema to refuse at its field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from app.cli.help_panels import LEARNING_RATE
from app.cli.options import PlanFlags
from app.client import Json
from app.core.records.plan_request import LRRule, Optimizer
from app.core.records.recommendation import Law

LawFlag = Annotated[
    Law | None,
    typer.Option(
        "--law",
        help="Take the global batch and peak lr from a published scaling law (step_law: Li et al. "
        "2025; deepseek: DeepSeek LLM 2024); needs --train-tokens, --sequence-length and the model.",
        rich_help_panel=LEARNING_RATE,
    ),
]
Params = Annotated[
    float | None,
    typer.Option(
        "--params",
        "--non-embedding-params",
        help="N: non-embedding parameters (e.g. 1.2e9).",
        rich_help_panel=LEARNING_RATE,
    ),
]
TrainTokens = Annotated[
    float | None,
    typer.Option(help="D: the tokens the run trains on (e.g. 1e11).", rich_help_panel=LEARNING_RATE),
]
FlopsPerToken = Annotated[
    float | None,
    typer.Option(
        help="M: non-embedding training FLOPs per token with attention (deepseek; not 6N).",
        rich_help_panel=LEARNING_RATE,
    ),
]
Layers = Annotated[
    int | None,
    typer.Option(help="Architecture: transformer layers (counts N and M).", rich_help_panel=LEARNING_RATE),
]
HiddenSize = Annotated[
    int | None, typer.Option(help="Architecture: hidden size.", rich_help_panel=LEARNING_RATE)
]
FfnHiddenSize = Annotated[
    int | None, typer.Option(help="Architecture: the FFN's inner width.", rich_help_panel=LEARNING_RATE)
]
NumHeads = Annotated[
    int | None,
    typer.Option(help="Architecture: attention heads (divide --hidden-size).", rich_help_panel=LEARNING_RATE),
]
NumKvHeads = Annotated[
    int | None,
    typer.Option(
        help="Architecture: key/value heads (divide --num-heads; default: all).",
        rich_help_panel=LEARNING_RATE,
    ),
]
VocabSize = Annotated[
    int | None,
    typer.Option(help="Architecture: vocabulary (reported, not counted).", rich_help_panel=LEARNING_RATE),
]
GatedFfn = Annotated[
    bool,
    typer.Option(
        "--gated-ffn/--no-gated-ffn",
        help="Architecture: a gated (SwiGLU) FFN.",
        rich_help_panel=LEARNING_RATE,
    ),
]
NoiseScaleCheck = Annotated[
    str | None,
    typer.Option(
        help="With --url: a finished check that measured the noise scale, put beside the law.",
        rich_help_panel=LEARNING_RATE,
    ),
]

ARCHITECTURE = ("layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size")
# The recipe flags that, without --base-lr, still shape the law's lr: the law gives base_lr.
RECIPE = (
    "warmup_epochs",
    "warmup_steps",
    "warmup_start_lr",
    "min_lr",
    "train_steps",
    "train_samples",
    "weight_decay",
    "max_grad_norm",
)


@dataclass(frozen=True)
class LawFlags:
    """`plan` and `export`: the scaling law's recommendation (the request's `recommend`)."""

    law: LawFlag = None
    non_embedding_params: Params = None
    train_tokens: TrainTokens = None
    flops_per_token: FlopsPerToken = None
    layers: Layers = None
    hidden_size: HiddenSize = None
    ffn_hidden_size: FfnHiddenSize = None
    num_heads: NumHeads = None
    num_kv_heads: NumKvHeads = None
    vocab_size: VocabSize = None
    gated_ffn: GatedFfn = True
    noise_scale_check: NoiseScaleCheck = None


def _count(value: float | None) -> Any:
    return int(value) if value is not None and value.is_integer() else value


def with_law(body: Json, law: LawFlags, flags: PlanFlags) -> Json:
    """`body` with the `recommend` the law flags ask for (unchanged without --law). Without
    --base-lr, the recipe flags given still make the plan's learning_rate (the law gives its lr)."""
    if law.law is None:
        return body
    recommend: Json = {"law": law.law.value, "train_tokens": _count(law.train_tokens)}
    for name in ("non_embedding_params", "flops_per_token"):
        if getattr(law, name) is not None:
            recommend[name] = _count(getattr(law, name))
    architecture = {name: getattr(law, name) for name in ARCHITECTURE if getattr(law, name) is not None}
    if architecture:
        recommend["architecture"] = {**architecture, "gated_ffn": law.gated_ffn}
    if law.noise_scale_check is not None:
        recommend["noise_scale_check"] = law.noise_scale_check
    out = {**body, "recommend": recommend}
    given = {name: getattr(flags, name) for name in RECIPE if getattr(flags, name) is not None}
    if "learning_rate" not in out and (given or flags.decay or flags.rule is not LRRule.AUTO):
        lr: Json = {**given, "rule": flags.rule.value}
        # The laws were fitted with AdamW: sgd, the flag's default, is taken as not asked for.
        lr["optimizer"] = (Optimizer.ADAMW if flags.optimizer is Optimizer.SGD else flags.optimizer).value
        if flags.decay is not None:
            lr["decay"] = flags.decay.value
        out["learning_rate"] = lr
    return out
