"""numpy's `np.random.default_rng(seed).shuffle(list(range(n)))`, bit for bit, in pure Python.

`datasets` orders a stream's shards with exactly that call (its `_shuffle_gen_kwargs`: once
with the dataset's seed, once more with the epoch as the seed), and the core may not import
numpy, so the pieces are written out here from numpy's own sources:

- `SeedSequence(seed)` (numpy/random/bit_generator.pyx): the seed as little-endian uint32
  words, hashed into a pool of 4 (`hashmix`, `mix`), then `generate_state(4, uint64)`;
- `PCG64` (numpy/random/_pcg64.pyx, src/pcg64/pcg64.h): `pcg_setseq_128_srandom_r` with
  initstate = words 0-1 and initseq = words 2-3 (high word first), the XSL-RR output of the
  state *after* each step, and `next_uint32` handing out the low half of a 64-bit draw and
  keeping the high half for the next call;
- `random_interval` (src/distributions/distributions.c): mask rejection, uint32 draws while
  the bound fits 32 bits (always, for a list of up to 2**32 items);
- `Generator.shuffle` on a Python sequence (_generator.pyx): `for i in reversed(range(1, n)):
  j = random_interval(i); x[i], x[j] = x[j], x[i]`.

tests/core/test_numpy_shuffle.py holds it to numpy itself over thousands of seeds and sizes.
"""

from __future__ import annotations

from functools import lru_cache

_M32 = 0xFFFF_FFFF
_M64 = 0xFFFF_FFFF_FFFF_FFFF
_M128 = (1 << 128) - 1

# SeedSequence's hash constants (bit_generator.pyx).
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = 0xCA01F9DD
_MIX_MULT_R = 0x4973F715
_XSHIFT = 16
_POOL_SIZE = 4

# PCG64's default multiplier (pcg64.h: PCG_DEFAULT_MULTIPLIER_HIGH, _LOW).
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341


def _seed_words(seed: int) -> list[int]:
    """`_int_to_uint32_array`: the lowest 32 bits first; 0 is one word."""
    if seed < 0:
        raise ValueError("numpy's SeedSequence takes non-negative seeds only")
    words = []
    while True:
        words.append(seed & _M32)
        seed >>= 32
        if not seed:
            return words


def _seed_state(seed: int) -> list[int]:
    """`SeedSequence(seed).generate_state(4, np.uint64)`."""
    hash_a = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hash_a
        value ^= hash_a
        hash_a = (hash_a * _MULT_A) & _M32
        value = (value * hash_a) & _M32
        return value ^ (value >> _XSHIFT)

    def mix(x: int, y: int) -> int:
        result = (_MIX_MULT_L * x - _MIX_MULT_R * y) & _M32
        return result ^ (result >> _XSHIFT)

    entropy = _seed_words(seed)
    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(_POOL_SIZE)]
    for i_src in range(_POOL_SIZE):
        for i_dst in range(_POOL_SIZE):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
    for word in entropy[_POOL_SIZE:]:
        for i_dst in range(_POOL_SIZE):
            pool[i_dst] = mix(pool[i_dst], hashmix(word))
    hash_b = _INIT_B
    words32 = []
    for i in range(2 * _POOL_SIZE):
        value = pool[i % _POOL_SIZE] ^ hash_b
        hash_b = (hash_b * _MULT_B) & _M32
        value = (value * hash_b) & _M32
        words32.append(value ^ (value >> _XSHIFT))
    # uint32 pairs read as little-endian uint64s
    return [words32[2 * k] | (words32[2 * k + 1] << 32) for k in range(_POOL_SIZE)]


class _Pcg64:
    """numpy's PCG64 bit generator, seeded as `PCG64(seed)`: its 128-bit LCG state and the
    half of a 64-bit draw that `next_uint32` keeps for the next call."""

    __slots__ = ("half", "inc", "state")

    def __init__(self, seed: int) -> None:
        s0, s1, s2, s3 = _seed_state(seed)
        initstate = (s0 << 64) | s1
        initseq = (s2 << 64) | s3
        self.inc = ((initseq << 1) | 1) & _M128
        state = (self.inc + initstate) & _M128  # the first step from state 0 leaves inc
        self.state = (state * _PCG_MULT + self.inc) & _M128
        self.half: int | None = None

    def next_uint64(self) -> int:
        """Step, then output XSL-RR of the new state (`pcg_setseq_128_xsl_rr_64_random_r`)."""
        state = (self.state * _PCG_MULT + self.inc) & _M128
        self.state = state
        value = (state >> 64) ^ (state & _M64)
        rot = state >> 122
        return ((value >> rot) | (value << (64 - rot))) & _M64


@lru_cache(maxsize=8)
def numpy_permutation(seed: int, n: int) -> tuple[int, ...]:
    """The list `idx = list(range(n)); np.random.default_rng(seed).shuffle(idx)` leaves.

    Cached: a plan asks for the same (seed, size) pairs again (each epoch's permutation, the
    suggested shard counts, the check's prediction). Up to 2**32 items, where every bound of
    `random_interval` fits 32 bits (numpy draws 64 bits past that; no shard list is as long)."""
    if n - 1 > _M32:
        raise ValueError("numpy_permutation covers lists of up to 2**32 items")
    items = list(range(n))
    _fisher_yates(_Pcg64(seed), items)
    return tuple(items)


def _fisher_yates(rng: _Pcg64, items: list[int]) -> None:
    """`for i in reversed(range(1, n)): j = random_interval(i)` and swap, with numpy's
    `next_uint32` (the low half of a 64-bit draw, the high half kept for the next call) and
    `random_interval`'s mask rejection written into the loop, the state held in locals: the
    loop runs once per shard."""
    state, inc, half = rng.state, rng.inc, rng.half
    mult, m128, m64, m32 = _PCG_MULT, _M128, _M64, _M32
    for i in range(len(items) - 1, 0, -1):
        mask = (1 << i.bit_length()) - 1
        while True:
            if half is None:
                state = (state * mult + inc) & m128
                value = (state >> 64) ^ (state & m64)
                rot = state >> 122
                draw = ((value >> rot) | (value << (64 - rot))) & m64
                half = draw >> 32
                j = draw & m32 & mask
            else:
                j = half & mask
                half = None
            if j <= i:
                break
        items[i], items[j] = items[j], items[i]
    rng.state, rng.half = state, half
