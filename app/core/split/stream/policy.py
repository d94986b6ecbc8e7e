"""A stream's micro-batches as the DataLoader delivers them, and what an end-of-epoch policy
trains of them, counted without a sample.

Each worker batches its own stream: worker w yields ceil(n_w / b) micro-batches, all of b
samples but its last. The DataLoader hands them out round by round: batch k of worker 0, of
worker 1, ..., then batch k + 1, skipping a worker that has finished (torch's `_try_put_index`
cycles over the workers, and `_next_data` returns in task order). The ranks' counts differ, and
the policy decides what each rank runs (every rank the same number, or a rank left waiting in
the all-reduce):

- drop: every rank stops at the fewest micro-batches any rank has; the rest is not trained;
- pad: a short rank goes on with full micro-batches of b cut from the start of its epoch's
  samples, in delivery order (as DistributedSampler pads from the start);
- cycle: a finished rank starts its stream again, the same micro-batches in the same order,
  until every rank has finished;
- steps: the stream repeats without end; an epoch is counted as cycle's, until every rank has
  read its stream once.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from app.core.records.integers import ceil_div
from app.core.records.stream import EndOfEpoch


def micro_batches(worker_samples: tuple[int, ...], b: int) -> int:
    return sum(ceil_div(n, b) for n in worker_samples)


def taken_per_worker(counts: list[int], x: int) -> list[int]:
    """Micro-batches each worker has delivered in the DataLoader's first x (x at most their sum),
    the workers holding `counts` micro-batches each."""
    # k whole rounds deliver sum(min(c_w, k)) micro-batches: take as many as fit, level by level
    # of the workers' counts (between two levels each round delivers one per unfinished worker).
    k = done = 0
    for i, c in enumerate(sorted(counts)):
        if c > k:
            unfinished = len(counts) - i
            rounds = min(c - k, (x - done) // unfinished)
            done, k = done + rounds * unfinished, k + rounds
            if k < c:
                break
    left = x - done  # round k's first `left` unfinished workers, in worker order
    taken = []
    for c in counts:
        n = min(c, k)
        if left and c > k:
            n, left = n + 1, left - 1
        taken.append(n)
    return taken


def samples_in_first(worker_samples: tuple[int, ...], b: int, x: int) -> int:
    """Samples in the first x micro-batches the DataLoader delivers (x at most their count)."""
    counts = [ceil_div(n, b) for n in worker_samples]
    taken = taken_per_worker(counts, x)
    return sum(min(n, t * b) for n, t in zip(worker_samples, taken, strict=True))


def short_positions(worker_samples: tuple[int, ...], b: int) -> list[tuple[int, int, int]]:
    """(place in the delivery order, worker, samples) of each worker's short last micro-batch.

    Worker w's last batch comes in round k = c_w - 1, after every worker's batches of the rounds
    before (sum of min(c_v, k)) and the earlier workers still on in round k (c_v >= c_w): counted
    with the counts sorted and a Fenwick tree over them, O(workers x log workers)."""
    counts = [ceil_div(n, b) for n in worker_samples]
    ordered = sorted(counts)
    prefix = [0, *accumulate(ordered)]
    rank = {v: i + 1 for i, v in enumerate(sorted(set(counts)))}
    tree = [0] * (len(rank) + 1)  # earlier workers, by their count's rank
    out = []
    for w, (n, c) in enumerate(zip(worker_samples, counts, strict=True)):
        if n % b:
            k = c - 1
            below = bisect_left(ordered, k)
            i, fewer = rank[c] - 1, 0  # earlier workers with a smaller count
            while i > 0:
                fewer, i = fewer + tree[i], i & (i - 1)
            out.append((prefix[below] + k * (len(counts) - below) + w - fewer, w, n % b))
        i = rank[c]
        while i < len(tree):
            tree[i], i = tree[i] + 1, i + (i & -i)
    return sorted(out)


def micro_batches_run(counts: list[int], policy: EndOfEpoch) -> int:
    """The micro-batches every rank runs in an epoch under the policy."""
    return min(counts) if policy == "drop" else max(counts)


def trained(worker_samples: tuple[int, ...], b: int, runs: int, policy: EndOfEpoch) -> tuple[int, int]:
    """(samples trained, repeats included; distinct samples trained) by a rank that runs `runs`
    micro-batches of its stream under the policy."""
    own = micro_batches(worker_samples, b)
    n = sum(worker_samples)
    if runs <= own:
        first = samples_in_first(worker_samples, b, runs)
        return first, first
    if policy == "pad":
        return n + (runs - own) * b, n
    passes, rest = divmod(runs, own)
    return passes * n + samples_in_first(worker_samples, b, rest), n
