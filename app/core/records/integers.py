"""Integer helpers: divisors of numbers up to 2**53 without scanning up to them.

Batch sizes may be as large as 2**53 - 1, so "the smallest accumulation count that
divides the batch" cannot be found by counting upwards; it is found from the
factorisation (Miller-Rabin + Pollard-Brent), which takes milliseconds at that size.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from functools import lru_cache

# Deterministic Miller-Rabin bases for every n < 3.3e24 (far above 2**53).
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_brent(n: int, rng: random.Random) -> int:
    """A non-trivial factor of the odd composite n."""
    while True:
        y, c, m = rng.randrange(1, n), rng.randrange(1, n), 128
        g = r = q = 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g


@lru_cache(maxsize=4096)
def factorize(n: int) -> tuple[tuple[int, int], ...]:
    """Prime factorisation of n >= 1 as sorted (prime, exponent) pairs."""
    if n < 1:
        raise ValueError("factorize needs n >= 1")
    counts: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        while n % p == 0:
            counts[p] = counts.get(p, 0) + 1
            n //= p
    # A fixed seed keeps the (already exact) result's cost repeatable.
    rng = random.Random(n)
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if is_prime(m):
            counts[m] = counts.get(m, 0) + 1
            continue
        f = _pollard_brent(m, rng)
        stack.extend((f, m // f))
    return tuple(sorted(counts.items()))


def divisors(n: int) -> list[int]:
    """All divisors of n >= 1, ascending."""
    result = [1]
    for p, e in factorize(n):
        result = [d * p**k for d in result for k in range(e + 1)]
    return sorted(result)


def smallest_divisor_at_least(n: int, low: int, high: int | None = None) -> int | None:
    """The least divisor d of n with low <= d (<= high), or None.

    Tries a short upward scan first: in real requests the answer is almost always
    within a few steps of `low`, and a scan is cheaper than a factorisation.
    """
    low = max(low, 1)
    top = n if high is None else min(n, high)
    if low > top:
        return None
    for d in range(low, min(top, low + 64) + 1):
        if n % d == 0:
            return d
    if top <= low + 64:
        return None
    for d in divisors(n):
        if d > top:
            return None
        if d >= low:
            return d
    return None


def nearest(values: Iterator[int] | list[int], target: int, count: int = 2) -> list[int]:
    """Up to `count` values below and `count` above target (target itself counts as
    both), nearest first, ties below first."""
    pool = sorted(set(values))
    below = [v for v in pool if v <= target][-count:]
    above = [v for v in pool if v > target][:count]
    return sorted(below + above, key=lambda v: (abs(v - target), v))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
