"""Why a check ended without a result, in words for its job: what the service saw, not
more (a check that never got its ranks says so, and that nothing was killed)."""

from __future__ import annotations

import logging

from app.worker.service.runner import CheckOrder, CheckRunner, RankError

log = logging.getLogger("batchplan.worker")


def model_error(job_id: str, err: RankError) -> str:
    """A rank's error for the job: with the model's traceback when the model raised it."""
    if err.ranks_kept:
        error = f"the model raised {err}; the check's ranks were kept"
    else:
        error = f"{err}; the check's ranks were killed and replaced"
    if err.traceback:
        log.warning("check %s: the model raised\n%s", job_id, err.traceback)
        error += "\n" + err.traceback
    return error


def timed_out(timeout: float, order: CheckOrder | None, runner: CheckRunner) -> str:
    """Why a check ended at its timeout: it ran too long on its ranks, or it never got
    them (then nothing was killed, and the pool's state says why)."""
    progress = order.progress if order is not None else None
    if progress is not None and progress.waiting_for and not progress.holding:
        warm = runner.warm()
        free = sum(1 for r in warm if not r.busy)
        state = f"{len(warm)} of {runner.size} warm, {free} free"
        if runner.spawn_error:
            state += f"; the last start failed: {runner.spawn_error}"
        return (
            f"{progress.waiting_for} rank processes were not free within timeout_s={timeout:g} "
            f"({state}); the check did not run"
        )
    error = f"the check did not finish within timeout_s={timeout:g}"
    if progress is not None and progress.holding:
        error += "; its ranks were killed and replaced"
    return error + ": " + _what_to_change(order)


def _what_to_change(order: CheckOrder | None) -> str:
    """The request's fields that set how long a check runs."""
    spec = order.spec if order is not None else None
    if spec is not None and spec.lr_scaling is not None:
        return f"lower lr_scaling.samples (it was {spec.lr_scaling.samples:,}) or raise timeout_s"
    if spec is not None and spec.steps > 1:
        return f"lower steps (it was {spec.steps}) or raise timeout_s"
    return "raise timeout_s, or check a smaller plan (fewer replicas, a smaller global_batch_size)"
