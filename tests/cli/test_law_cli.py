"""`batchplan plan|export --law ...`: a scaling law's batch and lr from the flags (the request's
`recommend`, docs/recommend.md), the same here and on a server, its refusals named by the
flags typed."""

from __future__ import annotations

import json

from support.cli import Invoke, both
from support.servers import Server

LAW = ["--law", "step_law", "--params", "1.2e9", "--train-tokens", "1e11", "--sequence-length", "2048"]
SHAPE = ["--layers", "16", "--hidden-size", "2048", "--ffn-hidden-size", "8192", "--num-heads", "16"]


def test_the_laws_batch_and_lr_from_the_flags_here_and_on_a_server(run: Invoke, server: Server) -> None:
    local, remote = both(run, server, "plan", *LAW, "--num-nodes", "4", "--json")
    assert local.exit_code == remote.exit_code == 0, local.stderr + remote.stderr
    assert json.loads(local.stdout) == json.loads(remote.stdout)
    plan = json.loads(local.stdout)
    rec = plan["recommendation"]
    assert rec["non_embedding_params"] == 1_200_000_000 and rec["train_tokens"] == 10**11
    assert plan["global_batch_size"] == rec["planned_batch_size"] == 544
    assert plan["learning_rate"]["lr"] == rec["lr"] and rec["within_fit"] is False  # N above 1.07B


def test_the_table_shows_the_law_and_the_architecture_flags_count_the_model(run: Invoke) -> None:
    out = run("plan", "--law", "deepseek", *SHAPE, "--train-tokens", "1e11", "--sequence-length", "2048")
    assert out.exit_code == 0, out.stderr
    assert "deepseek: batch" in out.stdout and "nearest batch this cluster splits" in out.stdout
    assert "step_law: batch" in out.stdout  # the alternative, from the architecture's N


def test_recipe_flags_without_base_lr_shape_the_laws_lr(run: Invoke) -> None:
    out = run("plan", *LAW, "--warmup-steps", "100", "--warmup-start-lr", "0", "--json")
    assert out.exit_code == 0, out.stderr
    lr = json.loads(out.stdout)["learning_rate"]
    assert (lr["optimizer"], lr["rule"], lr["warmup_steps"]) == ("adamw", "none", 100)


def test_an_export_says_the_batch_and_lr_came_from_the_law(run: Invoke) -> None:
    out = run("export", "torchrun", *LAW)
    assert out.exit_code == 0, out.stderr
    assert "from the step_law scaling law" in out.stdout


def test_refusals_name_the_flags(run: Invoke) -> None:
    out = run("plan", *LAW[:2], *SHAPE[:-1], "12", "--train-tokens", "1e11", "--sequence-length", "2048")
    assert out.exit_code == 2
    assert (
        "--num-heads 12 does not divide --hidden-size 2048" in out.stderr
        and "try --num-heads 8 (or 16, 4, 32)" in out.stderr
    )
    out = run(
        "plan", "--law", "deepseek", "--params", "1e9", "--train-tokens", "1e11", "--sequence-length", "2048"
    )
    assert out.exit_code == 2 and "needs M" in out.stderr
    out = run("plan", *LAW[:-2])
    assert out.exit_code == 2 and "recommend needs --sequence-length" in out.stderr
    out = run("plan", *LAW, "--noise-scale-check", "abc123")
    assert out.exit_code == 2 and "plan on that server" in out.stderr
