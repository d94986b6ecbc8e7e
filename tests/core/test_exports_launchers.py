"""The launch scripts the torchrun and slurm exports write, run by bash with a fake torchrun
that records its argv, and that argv read by torchrun's own argument parser."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from export_helpers import EVEN, MIXED, MIXED_CURVES, PINNED, SINGLE, export_input
from torch.distributed.run import get_args_parser

from app.core.exports.registry import export


def _run_launcher(text: str, tmp_path: Path, env: dict[str, str]) -> list[list[str]]:
    """Run a launch script with a fake torchrun that records its argv, as bash expands it."""
    fake = tmp_path / "torchrun"
    fake.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c "import json,sys; print(json.dumps(sys.argv[1:]))" "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "launch.sh"
    script.write_text(text)
    result = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{tmp_path}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_single_node_torchrun_parses_with_torchs_parser(tmp_path: Path) -> None:
    [argv] = _run_launcher(export("torchrun", export_input(SINGLE)).text, tmp_path, {})
    args = get_args_parser().parse_args(argv)
    assert args.standalone and args.nproc_per_node == "4" and args.training_script == "train.py"


def test_multi_node_torchrun_uses_c10d(tmp_path: Path) -> None:
    [argv] = _run_launcher(
        export("torchrun", export_input(EVEN["homogeneous"])).text, tmp_path, {"MASTER_ADDR": "10.0.0.1"}
    )
    args = get_args_parser().parse_args(argv)
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == ("2", "8", "c10d")
    assert args.rdzv_endpoint == "10.0.0.1:29500"


def test_multi_node_torchrun_refuses_to_start_without_master_addr(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as caught:
        _run_launcher(export("torchrun", export_input(EVEN["homogeneous"])).text, tmp_path, {})
    assert "MASTER_ADDR" in caught.value.stderr


@pytest.mark.parametrize("body", [MIXED, MIXED_CURVES], ids=["throughput", "curves"])
def test_uneven_torchrun_pins_node_ranks_in_group_order(body: dict[str, Any], tmp_path: Path) -> None:
    x = export_input(body)
    text = export("torchrun", x).text
    # The plan's own per-group micro-batches, in the script's summary of the plan.
    for group in x.plan.replica_groups:
        assert f"micro-batch {group.micro_batch_size}," in text
    parser = get_args_parser()
    for node_rank, nproc in [(0, "8"), (1, "8"), (2, "4")]:
        [argv] = _run_launcher(text, tmp_path, {"MASTER_ADDR": "h0", "NODE_RANK": str(node_rank)})
        args = parser.parse_args(argv)
        assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("3", nproc, node_rank)
        assert args.rdzv_backend == "static"
    with pytest.raises(subprocess.CalledProcessError):
        _run_launcher(text, tmp_path, {"MASTER_ADDR": "h0", "NODE_RANK": "3"})


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "body",
    [SINGLE, EVEN["homogeneous"], MIXED, PINNED, MIXED_CURVES],
    ids=["single", "even", "mixed", "pinned", "curves"],
)
def test_sbatch_script_passes_bash_n(body: dict[str, Any], tmp_path: Path) -> None:
    out = export("slurm", export_input(body))
    script = tmp_path / out.filename
    script.write_text(out.text)
    subprocess.run(["bash", "-n", str(script)], check=True, capture_output=True, timeout=10)
    directives = [line for line in out.text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --ntasks-per-node=1" in directives
    if body is EVEN["homogeneous"]:
        assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8"} <= set(directives)
    if body is MIXED or body is MIXED_CURVES:
        assert "#SBATCH hetjob" in directives


def test_sbatch_torchrun_line_parses(tmp_path: Path) -> None:
    text = export("slurm", export_input(EVEN["homogeneous"])).text
    srun = text[text.index("srun ") :].replace("\\\n", " ")
    # Expand the job's variables as Slurm would, then hand the words to torchrun's parser.
    expanded = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {srun[srun.index('torchrun') :]}"],
        env={"SLURM_NNODES": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29500", "SLURM_JOB_ID": "7"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")[:-1]
    args = get_args_parser().parse_args(expanded[1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_endpoint, args.rdzv_id) == ("2", "8", "n1:29500", "7")
