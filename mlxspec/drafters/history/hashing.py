"""64-bit polynomial hashes of n-grams, as Rabin-Karp's rolling hash: wrapping uint64
arithmetic on numpy arrays for many ids at once (the plain-Python path for a round's few
ids, in index.py, uses the same sums and the power tables here)."""

from __future__ import annotations

import numpy as np

MIX = 0x9E3779B97F4A7C15  # spreads small ids over the word
BASE = 0x5851F42D4C957F2D  # odd, so invertible modulo 2**64
BASE_INVERSE = pow(BASE, -1, 1 << 64)
SPREAD = 0xD6E8FEB86659FD93  # multiplicative hashing into a table of 2**bits buckets
MASK = (1 << 64) - 1
MOST_MATCH = 1 << 10  # the longest n-gram order an index may have
FEW = 16  # new ids linked in plain Python rather than numpy

_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, count: int) -> np.ndarray:
    """(count,) base**k modulo 2**64, from a table kept and doubled as needed."""
    table = _POWERS.get(base)
    if table is None or len(table) < count:
        table = np.full(max(count, 2 * len(table) if table is not None else 64), base, np.uint64)
        table[0] = 1
        table = np.cumprod(table, dtype=np.uint64)
        _POWERS[base] = table
    return table[:count]


# for the plain-Python path: its windows hold at most FEW new ids and the longest order's history
BASE_POWERS = [pow(BASE, k, 1 << 64) for k in range(MOST_MATCH + FEW)]
INVERSE_POWERS = [pow(BASE_INVERSE, k, 1 << 64) for k in range(MOST_MATCH + FEW)]


def prefix_sums(window: np.ndarray) -> np.ndarray:
    """(w,) sum over j <= k of mix(id[j]) * BASE**-j, modulo 2**64."""
    mixed = (window.astype(np.uint64) + np.uint64(1)) * np.uint64(MIX)
    return np.cumsum(mixed * _powers(BASE_INVERSE, len(window)), dtype=np.uint64)


def hashes(prefix: np.ndarray, n: int, at: np.ndarray) -> np.ndarray:
    """(len(at),) the hash of the n ids ending at each place `at` (>= n - 1) of a window:
    sum over j < n of mix(id[at - j]) * BASE**j, modulo 2**64, from its prefix sums."""
    before = np.where(at >= n, prefix[np.maximum(at - n, 0)], np.uint64(0))
    return _powers(BASE, int(at.max()) + 1)[at] * (prefix[at] - before)
