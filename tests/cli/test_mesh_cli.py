"""`batchplan plan` prints the device mesh and its rank map, laid out as torch lays out
init_device_mesh: arange(world) reshaped to the mesh's shape."""

from __future__ import annotations

import re

import pytest
from support.cli import Invoke


def test_rank_map_matches_torchs_mesh_layout(run: Invoke) -> None:
    torch = pytest.importorskip("torch")
    out = run(
        "plan", "--num-nodes", "1", "--gpus-per-node", "16", "-b", "64",
        "--tensor", "2", "--pipeline", "2", "--data-parallel-shard", "2",
    )  # fmt: skip
    assert out.exit_code == 0, out.stderr
    assert "device mesh pp 2 x dp_replicate 2 x dp_shard 2 x tp 2 (hsdp)" in out.stdout
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out.stdout, re.MULTILINE)
    assert len(rows) == 16
    layout = torch.arange(16).reshape(2, 2, 2, 2)  # pp, dp_replicate, dp_shard, tp
    for rank, pp, dp, cp, tp in (tuple(map(int, r)) for r in rows):
        p, rep, shard, t = (int(i) for i in (layout == rank).nonzero()[0])
        assert (pp, dp, cp, tp) == (p, rep * 2 + shard, 0, t)


def test_plain_ddp_prints_no_mesh(run: Invoke) -> None:
    out = run("plan", "--num-nodes", "1", "--gpus-per-node", "4", "-b", "16")
    assert out.exit_code == 0 and "device mesh" not in out.stdout
