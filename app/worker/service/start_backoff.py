"""How long the pool waits on a rank process's start, and after a failed one."""

from __future__ import annotations

# A fork warms up in tens of milliseconds once start() returns (the fork server has done the
# imports by then); one that takes this long is stuck and gets replaced. Each try in a row waits
# twice as long, up to WARM_UP_MAX_S: on a host so loaded that warming takes longer than the
# first wait, a fixed one would kill every start just before it was done, for ever.
WARM_UP_TIMEOUT_S = 15.0
WARM_UP_MAX_S = 120.0
# A start that failed (the fork server died under it, or the rank died before it was warm) is
# tried again after RETRY_FIRST_S, doubling up to RETRY_MAX_S: a fork server killed while it
# imports comes back at once, and one that cannot start at all does not spin.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 10.0
# A start that failed this many times in a row while no rank is warm: the pool is failing,
# and checks waiting for ranks fail at once with its reason (it keeps trying).
FAILING_AFTER = 5


def warm_up_patience(attempt: int) -> float:
    """How long the `attempt`-th start in a row may take to warm up."""
    return min(WARM_UP_TIMEOUT_S * 2.0**attempt, WARM_UP_MAX_S)


def retry_after(attempt: int) -> float:
    """The wait before trying again after the `attempt`-th failed start in a row."""
    return min(RETRY_FIRST_S * 2.0**attempt, RETRY_MAX_S)


def failing(attempt: int) -> bool:
    """Whether the `attempt`-th failed start in a row makes the pool failing."""
    return attempt + 1 >= FAILING_AFTER
