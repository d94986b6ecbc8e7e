"""The core's numpy shuffle (app.core.split.stream.numpy_shuffle) against numpy itself: the seed's
state, PCG64's raw draws, and `default_rng(seed).shuffle(list(range(n)))`, exactly, over
thousands of seeds (small, 32- and 64-bit edges, 2**127 and past the pool's four words) and
every size up to 300, and a few large ones."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.split.stream.numpy_shuffle import _Pcg64, _seed_state, numpy_permutation

EDGE_SEEDS = [
    2**31 - 1,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63 + 5,
    2**64 - 1,
    2**64,
    2**127,
    2**128 - 1,
    2**200 + 3,
]


def numpy_shuffled(seed: int, n: int) -> tuple[int, ...]:
    items = list(range(n))
    np.random.default_rng(seed).shuffle(items)  # a list: Generator.shuffle's sequence path
    return tuple(items)


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, *EDGE_SEEDS])
def test_the_seed_state_and_raw_draws_are_numpys(seed: int) -> None:
    assert _seed_state(seed) == [int(w) for w in np.random.SeedSequence(seed).generate_state(4, np.uint64)]
    ours, theirs = _Pcg64(seed), np.random.PCG64(seed)
    assert [ours.next_uint64() for _ in range(64)] == [int(x) for x in theirs.random_raw(64)]


def test_every_seed_to_2000_shuffles_as_numpy() -> None:
    mismatched = [s for s in range(2001) if numpy_permutation(s, s % 301) != numpy_shuffled(s, s % 301)]
    assert mismatched == []


@pytest.mark.parametrize("seed", [0, 3, 2**63 + 5, 2**127, 2**200 + 3])
def test_every_size_to_300_shuffles_as_numpy(seed: int) -> None:
    assert [n for n in range(301) if numpy_permutation(seed, n) != numpy_shuffled(seed, n)] == []


@pytest.mark.parametrize(("seed", "n"), [(42, 65_537), (2**63 + 5, 20_000), (1, 100_000)])
def test_large_shard_lists_shuffle_as_numpy(seed: int, n: int) -> None:
    assert numpy_permutation(seed, n) == numpy_shuffled(seed, n)


def test_a_bound_past_32_bits_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="2\\*\\*32"):
        numpy_permutation(0, 2**32 + 2)
    with pytest.raises(ValueError, match="non-negative"):
        numpy_permutation(-1, 3)
