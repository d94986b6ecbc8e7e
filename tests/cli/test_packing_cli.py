"""`batchplan plan|export --packing ...`: packed rows and token budgets from the flags (the
request's `packing`, docs/tokens.md), and their refusals named by the flags typed."""

from __future__ import annotations

import json

from support.cli import Invoke

LM = ["--num-nodes", "1", "--gpus-per-node", "4", "-b", "32", "-m", "2", "--sequence-length", "512"]
TOKEN = ["--loss-normalization", "token"]


def test_a_token_budget_from_the_flags(run: Invoke) -> None:
    flags = [
        "--packing",
        "token_budget",
        "--max-tokens-per-micro-batch",
        "1536",
        "--document-length-max",
        "400",
    ]
    out = run("plan", *LM, *TOKEN, *flags, "--json")
    assert out.exit_code == 0, out.stderr
    tokens = json.loads(out.stdout)["tokens"]
    assert tokens["packing"] == "token_budget" and tokens["tokens_per_micro_batch"] == 1536
    # 8 samples of at most 400 tokens a rank, each micro-batch but the last above 1136 tokens.
    assert tokens["max_micro_batches_per_step"] == 3 and tokens["max_valid_targets_per_step"] == 32 * 399
    table = run("plan", *LM, *TOKEN, *flags)
    assert "packing: token_budget, at most 12768 valid targets and 3 micro-batches" in table.stdout


def test_refusals_name_the_flags_typed(run: Invoke) -> None:
    out = run("plan", *LM, *TOKEN, "--packing", "token_budget", "--max-tokens-per-micro-batch", "100")
    assert out.exit_code == 2 and "try --max-tokens-per-micro-batch 512" in out.stderr, out.stderr
    out = run("plan", *LM, "--packing", "rows")
    assert out.exit_code == 2 and "give --loss-normalization token" in out.stderr, out.stderr
    out = run("export", "deepspeed", *LM, *TOKEN, "--packing", "rows")
    assert out.exit_code == 2 and "deepspeed export does not yet write packed rows" in out.stderr, out.stderr
    out = run("export", "python", *LM, *TOKEN, "--packing", "rows")
    assert out.exit_code == 0 and 'PACKING = "rows"' in out.stdout, out.stderr
