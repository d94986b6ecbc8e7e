"""BATCHPLAN_PROCESSES_PER_HOST=auto (the default): one warm rank per GPU the worker sees, counted
without importing torch; a few on a host without GPUs. That the default worker warms that many
(and /v1/host and /readyz say so) is tests/ops/test_container.py's worker image test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import Settings
from app.worker.service.limits import CPU_PROCESSES_PER_HOST, Limits, visible_gpus


def _dev(tmp_path: Path, gpus: int) -> Path:
    """A /dev as the NVIDIA driver (or the container toolkit, for the container's GPUs) lays it
    out: one nvidiaN per GPU beside the control nodes, which are not GPUs."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "null"]:
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    return dev


@pytest.mark.parametrize(
    ("cuda_visible_devices", "seen"),
    [
        (None, 8),  # every GPU of an 8-GPU node
        ("0,1,2,3", 4),
        ("3", 1),
        ("", 0),  # CUDA's way to hide every GPU
        ("-1", 0),
        ("0,1,-1,2", 2),  # CUDA stops at the first entry that is not a device
        ("0,9", 1),  # there is no GPU 9
        ("GPU-8f6b6c3e-0000-0000-0000-000000000000,GPU-2a1d0c3e-0000-0000-0000-000000000000", 2),
    ],
)
def test_visible_gpus_counts_the_device_nodes_narrowed_as_cuda_does(
    tmp_path: Path, cuda_visible_devices: str | None, seen: int
) -> None:
    environ = {} if cuda_visible_devices is None else {"CUDA_VISIBLE_DEVICES": cuda_visible_devices}
    assert visible_gpus(environ, _dev(tmp_path, 8)) == seen


def test_a_host_without_nvidia_devices_has_no_gpus(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, _dev(tmp_path, 0)) == 0
    assert visible_gpus({}, tmp_path / "no-such-dev") == 0


def _torch_device_count(environ: dict[str, str]) -> int:
    """What the ranks themselves see: torch.cuda.device_count(), in a process of its own (CUDA
    is not initialised in the test process, which forks)."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120, check=True
    )
    return int(out.stdout.strip())


def test_auto_is_one_rank_per_gpu_torch_sees_or_the_cpu_default() -> None:
    gpus = _torch_device_count(dict(os.environ))
    assert visible_gpus() == gpus
    limits = Limits.from_settings(Settings(processes_per_host="auto"))
    assert limits.processes_per_host == (gpus or CPU_PROCESSES_PER_HOST)
    assert Limits.from_settings(Settings(processes_per_host=2)).processes_per_host == 2


@pytest.mark.gpu
def test_auto_follows_cuda_visible_devices_as_torch_does() -> None:
    if visible_gpus() == 0:
        pytest.skip("no CUDA GPUs")
    for listed in ("0", "", ",".join(str(i) for i in range(visible_gpus()))):
        environ = dict(os.environ, CUDA_VISIBLE_DEVICES=listed)
        assert visible_gpus(environ) == _torch_device_count(environ), listed
