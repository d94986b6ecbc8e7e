"""Hugging Face Transformers models as check-model factories, tiny and random-init: how a
factory returns a model that takes dict batches and computes its own loss.

    BATCHPLAN_CHECK_MODELS="gpt2=app.worker.example_hf_models:gpt2"

Each returns `(model, dataset, None)`: `dataset[i]` is a dict (`input_ids`, `labels`, ...),
the check calls `model(**batch)` and trains on `outputs.loss`. Every sample here has the same
number of labelled tokens, so Transformers' mean over tokens is a mean over samples too.
transformers is imported when a factory runs, not with this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB, TOKENS, SAMPLES, WIDTH = 64, 12, 512, 16
# The sizes a one-layer BERT-style config (Llama's and BERT's) takes.
ONE_LAYER: dict[str, Any] = {
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "hidden_size": WIDTH,
    "intermediate_size": 2 * WIDTH,
    "vocab_size": VOCAB,
    "max_position_embeddings": TOKENS,
}


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences; for a language model the labels are the inputs (the model
    shifts them), for a classifier one class per sequence."""

    def __init__(self, seed: int, classes: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, TOKENS), generator=generator)
        self.classes = classes

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.ids[index]
        labels = ids.sum() % self.classes if self.classes else ids
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def gpt2(seed: int = 0, dropout: float = 0.0) -> tuple[nn.Module, Dataset[Any], None]:
    """A two-layer GPT-2 language model, dropout off (p=0) for the check."""
    from transformers import GPT2Config, GPT2LMHeadModel

    # All three of GPT-2's dropouts (residual, embedding, attention) take the one p.
    dropouts: dict[str, Any] = dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), dropout)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=WIDTH,
        vocab_size=VOCAB,
        n_positions=TOKENS,
        **dropouts,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).train(), Tokens(seed), None


def gpt2_with_dropout(seed: int = 0) -> tuple[nn.Module, Dataset[Any], None]:
    """GPT-2 with dropout 0.1, training: a random mask per forward pass."""
    return gpt2(seed, dropout=0.1)


def gpt2_eval_dropout(seed: int = 0) -> tuple[nn.Module, Dataset[Any], None]:
    """GPT-2 with dropout 0.1 but in eval mode where it is drawn: the Dropout modules, and
    the attention modules, whose forward passes their dropout rate to the attention kernel
    while they train."""
    model, data, _ = gpt2(seed, dropout=0.1)
    for module in model.modules():
        if isinstance(module, nn.Dropout) or type(module).__name__ == "GPT2Attention":
            module.eval()
    return model, data, None


def llama(seed: int = 0, attention_dropout: float = 0.1) -> tuple[nn.Module, Dataset[Any], None]:
    """A one-layer Llama language model; its attention dropout is functional (no module)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **ONE_LAYER,
        num_key_value_heads=2,
        attention_dropout=attention_dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LlamaForCausalLM(config).train(), Tokens(seed), None


def bert(seed: int = 0) -> tuple[nn.Module, Dataset[Any], None]:
    """A one-layer BERT sequence classifier without dropout; its loss is a mean over samples."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        **ONE_LAYER,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config.num_labels = 3  # a PretrainedConfig attribute that BertConfig's signature does not list
    return BertForSequenceClassification(config).train(), Tokens(seed, classes=3), None
