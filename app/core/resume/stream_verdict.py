"""Whether a rank_worker stream resumed on other ranks delivers the uninterrupted run's global
batches: each step, each reader's micro-batches that the ranks' DataLoaders deliver (round by
round over a rank's workers, a finished worker skipped: app.core.split.stream.policy), counted
in both runs reader by reader (app.core.resume.stream_resume plans the resume itself).

`old` is the plan's (workers per rank, accumulation, optimizer steps per epoch), `new` the
resumed run's (workers per rank, accumulation); the readers and their micro-batch counts
(`counts`, reader g = rank x workers + worker) are the same in both.
"""

from __future__ import annotations

from operator import sub

from app.core.records.integers import divisors
from app.core.request.limits import MAX_WORKERS
from app.core.split.stream.policy import taken_per_worker


def fits(readers: int, micro: int, batch: int) -> list[int]:
    """The data-parallel sizes that host the readers and split the global batch into micro-batches."""
    return [d for d in divisors(readers) if readers // d <= MAX_WORKERS and batch % (d * micro) == 0]


def verdict(counts: list[int], j: int, old: tuple[int, int, int], new: tuple[int, int]) -> str | None:
    """Why the later global batches differ on the resumed ranks: in this epoch from step j, else
    in a whole later one; None when every one is the same set."""
    why = _difference(counts, j, old, new)
    whole = _difference(counts, 0, old, new) if j else why
    return f"in this epoch, {why}" if why else (f"in the epochs after this one, {whole}" if whole else None)


def exact_sizes(
    counts: list[int], j: int, old: tuple[int, int, int], asked: int, micro: int, batch: int, tries: int
) -> list[int]:
    """The nearest two data-parallel sizes (of the `tries` nearest that fit) that resume exactly."""
    readers = len(counts)
    near = sorted((d for d in fits(readers, micro, batch) if d != asked), key=lambda d: (abs(d - asked), d))
    exact = [d for d in near[:tries] if verdict(counts, j, old, (readers // d, batch // (d * micro))) is None]
    return sorted(exact[:2])


class Delivery:
    """Each reader's micro-batches its rank's DataLoader has delivered after x, for ranks of
    `workers` readers each; ranks of equal counts counted once (most are)."""

    def __init__(self, counts: list[int], workers: int) -> None:
        self.ranks = [tuple(counts[r : r + workers]) for r in range(0, len(counts), workers)]
        self.seen: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def taken(self, x: int) -> list[int]:
        out: list[int] = []
        for own in self.ranks:
            key = (own, x)
            if key not in self.seen:
                self.seen[key] = taken_per_worker(list(own), min(x, sum(own)))
            out += self.seen[key]
        return out


def _difference(counts: list[int], j: int, old: tuple[int, int, int], new: tuple[int, int]) -> str | None:
    """Where the resumed run, from the plan's step j of an epoch, first delivers other micro-
    batches in a step than the plan's; None when every step is the same set.
    old: (workers, accumulation, the epoch's steps); new: (workers, accumulation)."""
    (K, a, S), (Kn, an) = old, new
    plans = Delivery(counts, K)
    done = plans.taken(j * a)
    rest = list(map(sub, counts, done))
    resumed = Delivery(rest, Kn)
    steps_new = min(sum(own) for own in resumed.ranks) // an
    for i in range(1, min(S - j, steps_new) + 1):
        if list(map(sub, plans.taken((j + i) * a), done)) != resumed.taken(i * an):
            return f"step {j + i - 1} of the epoch takes other micro-batches on the resumed ranks"
    if steps_new != S - j:
        return f"the epoch holds {j + steps_new} steps on the resumed ranks, {S} on the plan's"
    return None
