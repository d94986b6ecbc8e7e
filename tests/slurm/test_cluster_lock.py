"""One test Slurm cluster at a time on this host (slurm_cluster.host_lock): a second run, from
another pytest-xdist worker or another checkout, waits for the first and names it if it waits
too long; the lock is free again once its holder is gone. No Slurm needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_cluster import host_lock

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_a_second_holder_waits_then_names_the_first_and_gets_it_once_the_first_is_gone(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "cluster.lock"
    hold = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); from pathlib import Path; "
        "from slurm_cluster import host_lock\n"
        f"with host_lock(Path({str(lock)!r})):\n    print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RuntimeError, match=f"its pid: {holder.pid}"), host_lock(lock, wait_s=1):
            pass
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder leaves its `with` and exits
        holder.wait(timeout=30)
    with host_lock(lock, wait_s=5):
        assert lock.read_text() == str(os.getpid())
