"""What a packed or budgeted `tokens` check needs before any rank starts: how many seeded steps
it holds, and whether this install can pack rows (transformers, in the `consumers` extra)."""

from __future__ import annotations

from importlib.util import find_spec

PACKED_STEPS = 3  # seeded steps a packed check holds against the reference, each its own draw


def collator_refusal(missing: str | None = None) -> str | None:
    """Why `rows` cannot be checked here, or None when transformers is installed. `missing`: the
    import error a rank met, where it tried."""
    if missing is None and find_spec("transformers") is not None:
        return None
    return (
        "packing mode rows packs through transformers' DataCollatorWithFlattening, which "
        f"{missing or 'is not installed'} where the ranks run; install batchplan[consumers] there, "
        "or check mode token_budget"
    )
