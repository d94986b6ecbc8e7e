"""N (non-embedding parameters) and M (non-embedding training FLOPs per token) of a
decoder-only transformer, counted from its shape as the scaling laws count them.

With L layers, hidden size h, FFN width f, H heads of d = h / H dimensions and K key/value heads:

    N = L x (h H d  +  2 h K d  +  H d h  +  g h f)        q, k and v, o, the FFN (g = 3 gated, 2 not)
    M = 6 N + 12 L (H d) l_seq                            forward and backward, attention over l_seq

Norms, biases, the embedding and the LM head are left out, as both papers leave them out; the
vocabulary enters neither. Each paper's own convention is this formula on its own shapes:

- Step Law counts N = L (4 h^2 + 3 h f): multi-head attention (K = H) and a gated FFN, as every
  run of its released grid has (its five shapes, from 214,663,680 to 1,073,741,824).
- DeepSeek's M = 72 L h^2 + 12 L h l_seq (their eq. 2) is 6 N + 12 L h l_seq for multi-head
  attention and 8 h^2 FFN weights per layer (a gated FFN of 8h/3, or a plain one of 4h). For a
  model unlike that (grouped-query attention, another FFN width) this module counts the weights
  the model has; `deepseek_eq2` is theirs, which the answer states beside it.
"""

from __future__ import annotations

from app.core.errors.domain import InvalidValue
from app.core.records.integers import divisors, nearest
from app.core.records.recommendation import Architecture

_ARCH = "/recommend/architecture/"


def check_architecture(a: Architecture) -> None:
    """Raise InvalidValue at the field of a shape that is not a transformer's."""
    for name in ("layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size"):
        value = getattr(a, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidValue(f"{name} must be a whole number of at least 1", pointer=_ARCH + name)
    if a.hidden_size % a.num_heads:
        raise InvalidValue(
            f"num_heads {a.num_heads} does not divide hidden_size {a.hidden_size}: every head has "
            f"hidden_size / num_heads dimensions",
            pointer=_ARCH + "num_heads",
            suggestions={"recommend.architecture.num_heads": nearest(divisors(a.hidden_size), a.num_heads)},
        )
    kv = a.num_kv_heads
    if kv is not None and a.num_heads % kv:
        raise InvalidValue(
            f"num_kv_heads {kv} does not divide num_heads {a.num_heads}: each key/value head serves "
            f"a whole group of query heads",
            pointer=_ARCH + "num_kv_heads",
            suggestions={"recommend.architecture.num_kv_heads": nearest(divisors(a.num_heads), kv)},
        )


def non_embedding_params(a: Architecture) -> int:
    head_dim = a.hidden_size // a.num_heads
    kv = a.num_heads if a.num_kv_heads is None else a.num_kv_heads
    h, q = a.hidden_size, a.num_heads * head_dim
    attention = h * q + 2 * h * kv * head_dim + q * h
    ffn = (3 if a.gated_ffn else 2) * h * a.ffn_hidden_size
    return a.layers * (attention + ffn)


def flops_per_token(a: Architecture, sequence_length: int) -> int:
    """Training FLOPs per token (6 per weight, forward and backward) plus attention's scores and
    weighted sum over the whole sequence (DeepSeek's 12 L h l_seq; no causal halving)."""
    q = a.num_heads * (a.hidden_size // a.num_heads)
    return 6 * non_embedding_params(a) + 12 * a.layers * q * sequence_length


def deepseek_eq2(layers: int, hidden_size: int, sequence_length: int) -> int:
    """DeepSeek LLM's eq. (2): M = 72 n_layer d_model^2 + 12 n_layer d_model l_seq."""
    return 72 * layers * hidden_size**2 + 12 * layers * hidden_size * sequence_length


def embedding_params(a: Architecture) -> int | None:
    return None if a.vocab_size is None else a.vocab_size * a.hidden_size


def convention(a: Architecture, sequence_length: int) -> str:
    """How M was counted for this architecture, with DeepSeek's eq. (2) beside it."""
    m = flops_per_token(a, sequence_length)
    eq2 = deepseek_eq2(a.layers, a.hidden_size, sequence_length)
    same = "the same" if m == eq2 else f"{eq2:.5g}, {100 * (eq2 / m - 1):+.1f}%"
    return (
        f"M = 6 x N + 12 x layers x hidden x sequence_length = {m:.5g} FLOPs per token: DeepSeek's "
        f"non-embedding FLOPs with attention, counted from this model's own weights (its FFN width and "
        f"key/value heads); their eq. (2), 72 x layers x hidden^2 + 12 x layers x hidden x "
        f"sequence_length, which assumes multi-head attention and 8 hidden^2 FFN weights, gives {same}"
    )
