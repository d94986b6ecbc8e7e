"""The command line that runs the rank program under torchrun: what the CLI, the tests and
the benchmarks start. Torch-free, so that building it never imports torch."""

from __future__ import annotations

import sys
from collections.abc import Sequence

# The module torchrun starts on every node: the documented name (app.worker.gradcheck
# re-exports app.worker.rank.program).
RANK_PROGRAM = "app.worker.gradcheck"


def torchrun_argv(
    request: str,
    *,
    nproc_per_node: int,
    rdzv_endpoint: str,
    nnodes: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command that runs the rank program under torchrun on one node of a check (the one
    spelled in app.worker.rank.program's docstring); rank 0 prints the result JSON (with
    --result-on-every-node, each node's first process does).
    `extra`: more of this program's options (--model-factory, --timeout-s)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
        "-m", RANK_PROGRAM, "--request", request, *extra,
    ]  # fmt: skip
