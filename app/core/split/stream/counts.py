"""Each rank's shards and samples per worker, counted without a sample, as runs of
consecutive ranks with the same figures (stream_layout states the rules counted here).

Where the shards are shared out by `num_samples` in their own order (or are all equal, in any
order), reader g of R gets S // R shards, one more for g < S % R, and of the m = N % S larger
shards (which stand first) m // R, one more for g < m % R: a rank's figures change only where
one of its readers crosses one of those two thresholds, at most 2 x workers ranks, and a plan
of a million shards or 2**53 - 1 samples costs milliseconds. A shard_samples list, or uneven
shards in a permuted order, is summed shard by shard (up to MAX_COUNTED_SHARDS); the examples
branch needs only each worker's stream length L_w, whose ws-th parts change at r = L_w % ws.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from app.core.records.integers import ceil_div
from app.core.records.stream import Branch, StreamSpec
from app.core.split.stream.layout import branch, needs_order, shard_order

Figures = tuple[tuple[int, ...], tuple[int, ...]]  # (shards, samples) per worker
Run = tuple[int, int, Figures]  # ranks [start, stop) and their figures


def _runs(world_size: int, cuts: Iterable[int], figures_at: Callable[[int], Figures]) -> list[Run]:
    """The ranks cut where their figures may change, equal neighbours merged."""
    starts = sorted({0, *(c for c in cuts if 0 < c < world_size)})
    runs: list[Run] = []
    for start, stop in zip(starts, [*starts[1:], world_size], strict=True):
        figures = figures_at(start)
        if runs and runs[-1][2] == figures:
            runs[-1] = (runs[-1][0], stop, figures)
        else:
            runs.append((start, stop, figures))
    return runs


def _sizes(spec: StreamSpec) -> tuple[int, int]:
    """(q, m): every shard holds q samples, the first m one more."""
    if spec.shard_samples is not None:  # all equal here
        return spec.shard_samples[0], 0
    return divmod(spec.num_samples or 0, spec.num_shards)


def _residue_sums(spec: StreamSpec, order: tuple[int, ...] | None, modulus: int) -> list[int]:
    """Samples at the positions p of `order` with p % modulus = g, for each g < modulus."""
    S = spec.num_shards
    if spec.shard_samples is not None:
        sizes = spec.shard_samples
        ordered = sizes if order is None else tuple(sizes[i] for i in order)
    elif order is None:  # closed form: the m larger shards stand first
        q, m = _sizes(spec)
        M = modulus
        return [q * (S // M + (g < S % M)) + m // M + (g < m % M) for g in range(M)]
    else:
        q, m = _sizes(spec)
        ordered = tuple(q + 1 if i < m else q for i in order)
    live = min(modulus, len(ordered))  # the readers past the shards read nothing
    return [sum(ordered[g::modulus]) for g in range(live)] + [0] * (modulus - live)


def _readers(splitter: str, world_size: int, K: int, r: int) -> range:
    """The residues g (positions p % R) of rank r's workers, in worker order."""
    if splitter == "rank_worker":
        return range(r * K, (r + 1) * K)
    return range(r, world_size * K, world_size)


def _closed_form(spec: StreamSpec, world_size: int, K: int) -> list[Run]:
    S, R = spec.num_shards, world_size * K
    q, m = _sizes(spec)

    def figures_at(r: int) -> Figures:
        gs = _readers(spec.splitter or "", world_size, K, r)
        shards = tuple(S // R + (g < S % R) for g in gs)
        larger = tuple(m // R + (g < m % R) for g in gs)
        return shards, tuple(q * n + big for n, big in zip(shards, larger, strict=True))

    cuts = []
    for threshold in {S % R, m % R}:
        for w in range(K):  # where worker w's reader crosses the threshold
            if spec.splitter == "rank_worker":
                cuts.append(ceil_div(threshold - w, K))
            else:
                cuts.append(threshold - world_size * w)
    return _runs(world_size, cuts, figures_at)


def _shard_by_shard(spec: StreamSpec, world_size: int, K: int, order: tuple[int, ...] | None) -> list[Run]:
    S, R = spec.num_shards, world_size * K
    sums = _residue_sums(spec, order, R)
    shards = [S // R + 1] * (S % R) + [S // R] * (R - S % R)

    def figures_at(r: int) -> Figures:
        if spec.splitter == "rank_worker":
            return tuple(shards[r * K : (r + 1) * K]), tuple(sums[r * K : (r + 1) * K])
        return tuple(shards[r::world_size]), tuple(sums[r::world_size])

    return _runs(world_size, range(1, world_size), figures_at)


def rank_runs(spec: StreamSpec, world_size: int, epoch: int) -> tuple[Branch | None, list[Run]]:
    """The branch, and the ranks in runs of equal (shards, samples) per worker."""
    assert spec.splitter is not None
    S, K = spec.num_shards, max(1, spec.num_workers)
    order = shard_order(spec, epoch) if needs_order(spec, epoch) else None
    kind = branch(spec.splitter, S, world_size)
    if kind == "examples":
        lengths = _residue_sums(spec, order, K)
        shards = tuple(max(0, ceil_div(S - w, K)) for w in range(K))
        return kind, _runs(
            world_size,
            (length % world_size for length in lengths),
            lambda r: (shards, tuple(n // world_size + (r < n % world_size) for n in lengths)),
        )
    if order is None and (spec.shard_samples is None or len(set(spec.shard_samples)) == 1):
        return kind, _closed_form(spec, world_size, K)
    return kind, _shard_by_shard(spec, world_size, K, order)
