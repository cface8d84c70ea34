"""The target's hidden states by position, for drafters that read them (EAGLE-3, MTP).

A target cursor writes the features of every forward at the position it started from; a
forward at position `start` means the cache was brought back to `start` ids first (a trim, a
checkpoint, a fresh cache), so every feature at or after `start` describes a text the cache
no longer holds and is dropped. Features below the cursor's length are therefore always the
ones its cache computed for the ids it holds. Lazy arrays: nothing is copied or waited for.
"""

from __future__ import annotations

import mlx.core as mx

COMPACT_AFTER = 64  # blocks (one per forward) before the older ones are joined into one


class FeatureStore:
    def __init__(self):
        self.blocks: list[tuple[int, mx.array]] = []  # (first position, (n, width)), in order

    @property
    def end(self) -> int:
        return self.blocks[-1][0] + self.blocks[-1][1].shape[0] if self.blocks else 0

    @property
    def start(self) -> int:
        return self.blocks[0][0] if self.blocks else 0

    def write(self, start: int, rows: mx.array) -> None:
        """Rows (n, width) for positions start .. start + n - 1."""
        self.truncate(start)
        if start != self.end and self.blocks:  # a gap: what came before no longer joins on
            self.blocks = []
        self.blocks.append((start, rows))
        if len(self.blocks) > COMPACT_AFTER:
            first = self.blocks[0][0]
            self.blocks = [(first, mx.concatenate([b for _, b in self.blocks[:-1]])), self.blocks[-1]]

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on."""
        while self.blocks and self.blocks[-1][0] >= length:
            self.blocks.pop()
        if self.blocks and self.end > length:
            first, rows = self.blocks[-1]
            self.blocks[-1] = (first, rows[: length - first])

    def covers(self, begin: int, end: int) -> bool:
        return begin >= end or (bool(self.blocks) and self.start <= begin and end <= self.end)

    def read(self, begin: int, end: int) -> mx.array:
        """Rows for positions begin .. end - 1, (end - begin, width)."""
        if not self.covers(begin, end):
            raise LookupError(f"no features for positions {begin}..{end - 1} (held: {self.start}..{self.end - 1})")
        parts = []
        for first, rows in reversed(self.blocks):
            last = first + rows.shape[0]
            if last <= begin:
                break
            if first < end:
                parts.append(rows[max(begin - first, 0) : min(end, last) - first])
        return parts[0] if len(parts) == 1 else mx.concatenate(parts[::-1])
