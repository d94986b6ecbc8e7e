"""The megatron and torchtitan exports of packed rows, held to the installed tools' own code:
megatron-core 0.16.1's GPTDataset masks (`_get_ltor_masks_and_position_ids`, the function the
exported `--reset-position-ids --reset-attention-mask --eod-mask-loss` switch on) count the
plan's valid targets, and its schedule's loss step (`forward_step_calc_loss`) under the
exported `--calculate-per-token-loss` leaves each micro-batch's sum for the step's global count
to divide, the plan's scale; torchtitan's TOML of packed rows holds the same tables as the
unpacked plan's, which torchtitan 0.2.2's ConfigManager loads (test_exports_language_models.py).

Both megatron functions are loaded from the installed schedules and dataset modules' source
alone: importing `megatron.core` pulls in its whole model stack (20 CPU-s here). The loss step's
one import, the multi-token-prediction scaler, is used only with `mtp_num_layers` set, which
this config leaves out: it is stood in for."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from export_helpers import export_input

from app.core.exports.registry import export
from app.schemas.examples import plan_example

torch = pytest.importorskip("torch")

PACKED = plan_example("packed_rows")  # 32 GPUs, tensor 2: 16 replicas of rows of 4096
SMALL = {  # the same layout, small enough to build every row of a step
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 8,
    "micro_batch_size": 1,
    "sequence_length": 24,
    "loss_normalization": "token",
    "packing": {"mode": "rows", "document_length": {"max": 6}},
}
EOD = 0


def _megatron_function(path: str, name: str) -> Any:
    """`name`, defined from the installed megatron-core file's own source."""
    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("megatron-core is not installed (consumers group)")
    source = Path(str(dist.locate_file(path))).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {"torch": torch, "parallel_state": None, "MoEAuxLossAutoScaler": None}
    exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace[name]


def _megatron_flags(body: dict[str, Any]) -> list[str]:
    text = export("megatron", export_input(body)).text
    return subprocess.run(
        ["bash", "-c", text + '\nprintf "%s\\n" "${MEGATRON_ARGS[@]}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_megatrons_masks_and_per_token_loss_give_the_plans_count_and_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flags = _megatron_flags(SMALL)
    for flag in (
        "--calculate-per-token-loss",
        "--reset-position-ids",
        "--reset-attention-mask",
        "--eod-mask-loss",
    ):
        assert flag in flags
    x = export_input(SMALL)
    masks = _megatron_function("megatron/core/datasets/gpt_dataset.py", "_get_ltor_masks_and_position_ids")
    seq, longest = 24, 6
    # Every row of the step packs documents of the longest length, each ending in EOD: the most
    # targets a step holds, the plan's bound.
    row = torch.tensor(([5] * (longest - 1) + [EOD]) * (seq // longest))
    attention, loss_mask, positions = masks(row, EOD, True, True, True, True)
    assert positions.tolist() == list(range(longest)) * (seq // longest)
    assert bool(attention[0, longest, longest - 1])  # masked: no document sees the one before it
    assert x.plan.tokens is not None
    assert int(loss_mask.sum()) * x.plan.global_batch_size == x.plan.tokens.max_valid_targets_per_step

    monkeypatch.setitem(
        sys.modules,
        "megatron.core.transformer.multi_token_prediction",
        types.SimpleNamespace(MTPLossAutoScaler=None),
    )
    step = _megatron_function("megatron/core/pipeline_parallel/schedules.py", "forward_step_calc_loss")
    generator = torch.Generator().manual_seed(0)
    # Two ranks, unequal micro-batches of unequal targets: per-target losses and their masks.
    ranks = [[(16, 3), (9, 1)], [(20, 2)]]
    batches = [
        [
            (torch.rand(n + m, generator=generator, dtype=torch.float64), torch.tensor([1.0] * n + [0.0] * m))
            for n, m in r
        ]
        for r in ranks
    ]

    def backpropagated(per_token: bool) -> tuple[float, int]:
        """What every rank back-propagates, summed as DDP with per-token loss sums the buckets, and
        the step's count as finalize_model_grads all-reduces it."""
        config = types.SimpleNamespace(calculate_per_token_loss=per_token, timers=None)
        total, count = 0.0, 0
        for rank in batches:
            for losses, mask in rank:
                out, n = step(
                    None,
                    losses,
                    lambda t, mask=mask: (torch.sum(t * mask), mask.sum().int(), {}),
                    config,
                    None,
                    False,
                    len(rank),
                    [],
                    cp_group_size=1,
                    is_last_stage=True,
                )
                total, count = total + float(out), count + int(n)
        return total, count

    exact = sum(float((losses * mask).sum()) for rank in batches for losses, mask in rank) / 45
    summed, count = backpropagated(True)
    assert count == 45 and summed / count == pytest.approx(exact, rel=1e-15)
    means, _ = backpropagated(False)  # the mean of micro-batch means, each rank's then averaged
    assert means / len(batches) != pytest.approx(exact, rel=1e-3)


def _tables(toml: str) -> list[str]:
    """A TOML export's lines but its comments (the notes): what torchtitan's loader reads."""
    return [line for line in toml.splitlines() if not line.startswith("#")]


def test_torchtitan_reads_the_packed_toml_as_the_plans_and_its_notes_name_the_holes() -> None:
    """Packed, the language model's TOML differs from unpacked only in its notes: the tables that
    torchtitan 0.2.2's own ConfigManager loads in test_exports_language_models.py (a process of
    its own at 12 CPU-s is not run again for the same tables)."""
    unpacked = plan_example("language_model")
    packed = {**unpacked, "packing": {"mode": "rows"}}
    text = export("torchtitan", export_input(packed)).text
    assert _tables(text) == _tables(export("torchtitan", export_input(unpacked)).text)
    # Pure DDP: torchtitan 0.2.2's replicate averages what its global count already divided.
    assert "torchtitan#2318" in text and "block_causal" in text and "torchtitan#2972" not in text
    sharded = {**PACKED, "parallelism": {"tensor": 2, "pipeline": 2, "data_parallel_shard": 8}}
    notes = export("torchtitan", export_input(sharded)).text
    assert "torchtitan#2318" not in notes and "torchtitan#2972" in notes
