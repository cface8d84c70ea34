"""The target's hidden states by position, for drafters that read them (EAGLE-3, MTP).

A target cursor writes the features of every forward at the position it started from; a
forward at position `start` means the cache was brought back to `start` ids first (a trim, a
checkpoint, a fresh cache), so every feature at or after `start` describes a text the cache
no longer holds and is dropped. Features below the cursor's length are therefore always the
ones its cache computed for the ids it holds.

One buffer, grown by doubling and written in place by slices (as mlx-lm's KVCache is), so
a write costs the rows written and a read of old rows no deep graph of joins.
"""

from __future__ import annotations

import mlx.core as mx

GROW = 256  # rows added at least when the buffer is full


class FeatureStore:
    def __init__(self):
        self.buffer: mx.array | None = None  # (capacity, width)
        self.start = 0  # the position of row 0 of the buffer
        self.end = 0  # positions start .. end - 1 are held

    def write(self, start: int, rows: mx.array) -> None:
        """Rows (n, width) for positions start .. start + n - 1."""
        if not self.start <= start <= self.end or self.buffer is None:  # a gap: begin again here
            self.buffer, self.start, self.end = None, start, start
        n = rows.shape[0]
        offset = start - self.start
        if self.buffer is None or offset + n > self.buffer.shape[0]:
            capacity = max(2 * (offset + n), GROW)
            grown = mx.zeros((capacity, rows.shape[1]), dtype=rows.dtype)
            if self.buffer is not None and offset:
                grown[:offset] = self.buffer[:offset]
            self.buffer = grown
        self.buffer[offset : offset + n] = rows
        self.end = start + n

    def keep_block_rows(self, start: int, count: int, kept: list[int]) -> None:
        """Rows start .. start + count - 1 were a tree's block: keep the block's rows `kept`
        (increasing), moved to the block's front, and forget the rest (caches.py's twin)."""
        if not self.covers(start, start + count):
            self.forget_from(start)
            return
        first = start - self.start
        if any(r != i for i, r in enumerate(kept)):
            rows = mx.array([first + r for r in kept])
            self.buffer[first : first + len(kept)] = self.buffer[rows]
        self.end = start + len(kept)

    def forget_from(self, position: int) -> None:
        """A forward that keeps no features started here: what is held from here on no
        longer describes the cache's ids."""
        self.end = max(self.start, min(self.end, position))

    def covers(self, begin: int, end: int) -> bool:
        return begin >= end or (self.buffer is not None and self.start <= begin and end <= self.end)

    def read(self, begin: int, end: int) -> mx.array:
        """Rows for positions begin .. end - 1, (end - begin, width)."""
        if not self.covers(begin, end):
            raise LookupError(f"no features for positions {begin}..{end - 1} (held: {self.start}..{self.end - 1})")
        return self.buffer[begin - self.start : end - self.start]
