"""The row bookkeeping of a drafter that reads the target's hidden states (an EAGLE-3 or MTP
head, a DFlash block drafter): its cache holds one row per position the target has read,
made from the target's features there (the cursor's FeatureStore), so it follows the
target's history instead of keeping ids of its own.

A row at position j stays valid while the ids it was made from are still the target's: ids
0 .. j, and `reads_ahead` more (an EAGLE-3 row j reads id j + 1 beside the features at j; a
DFlash row reads the features alone). Before each proposal the rows whose ids the target no
longer holds (a rejection, a new prompt sharing a prefix) are trimmed, and the rows the
target has read since are read from the store; after an interruption (Ctrl-C inside a
forward) the drafter starts again from the target's features, which the store keeps for
everything the target's cache holds."""

from __future__ import annotations

import time
from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from ..decoding.cursor import CATCH_UP_AFTER, PREFILL_STEP, Cursor, common_prefix
from ..decoding.packed import Lane


class FeatureRows:
    kind: str
    reads_ahead: int  # ids a row reads past its own position

    def __init__(self, target: Cursor, *, name: str):
        if target.features is None:
            raise ValueError(f"a {self.kind} drafter needs a target cursor that keeps its features")
        self.target = target
        self.name = name
        self.width = target.width
        self.reset()

    # -- its cache: a lane of a batch's packed drafter cache (packed.py), or one of its own
    def reset(self) -> None:
        """An empty cache (in a batch: its lane, emptied); no ids."""
        if isinstance(getattr(self, "cache", None), Lane):
            self.cache.trim_to(0)
        else:
            self.cache = self._own_cache()
        # the target's ids through the last one a row read (rows + reads_ahead of them; none
        # when no row is read): row j is valid while ids 0 .. j + reads_ahead are the target's
        self.ids: list[int] = []

    @property
    def rows(self) -> int:
        return self.cache.length if isinstance(self.cache, Lane) else self._own_rows()

    def _trim_cache(self, rows: int) -> None:
        if isinstance(self.cache, Lane):
            self.cache.trim_to(rows)
        else:
            self._trim_own(rows)

    # -- what a kind says: its own cache and how it reads rows
    def _own_rows(self) -> int:
        """Rows its own cache holds."""
        raise NotImplementedError

    def _trim_own(self, rows: int) -> None:
        """Its own cache back to `rows` rows."""
        raise NotImplementedError

    def _read_rows(self, begin: int, end: int) -> None:
        """Read rows begin .. end - 1 from the target's features (and ids) into the cache."""
        raise NotImplementedError

    def _state(self):
        """The cache's arrays, to evaluate."""
        raise NotImplementedError

    def _own_cache(self, states: list | None = None):
        """A cache of its own, empty or holding `states` (per layer: keys and values, (1,
        heads, rows, dim), evaluated)."""
        raise NotImplementedError

    def _own_states(self) -> list:
        """Per layer of its own cache: the keys and values of the rows it holds."""
        raise NotImplementedError

    # -- a batch's calls (its cache a lane of the batch's packed drafter cache, packed.py)
    def _lane_step(self) -> int:
        """Rows a lane reads at most in one read: the batch's chunk while other lanes wait
        for each forward, else the target's prefill step (a packed read's mask grows with
        the square of its rows)."""
        return min(PREFILL_STEP, self.cache.chunk or PREFILL_STEP)

    def join(self, packed) -> None:
        """Move the rows into a lane of `packed` (a batch's drafter cache)."""
        lane = packed.lane()
        try:
            if self.rows:
                packed.adopt(lane, self._own_states())
        except BaseException:
            packed.release(lane)
            raise
        self.cache = lane

    def leave(self) -> None:
        """Out of its lane, into a cache of its own holding the same rows (none, should
        copying them out fail or be interrupted: it then reads the target's features
        again)."""
        lane, ids, own = self.cache, self.ids, None
        try:
            own = self._own_cache(lane.packed.gather(lane) if lane.length else None)
        finally:  # out of the lane whatever happens, the row freed
            self.cache, self.ids = (own, ids) if own is not None else (self._own_cache(), [])
            lane.packed.release(lane)

    @property
    def draft_to_target(self) -> mx.array | None:
        """The target id of each of the drafter's ids, where it scores part of the target's
        vocabulary; None: its ids are the target's."""
        raise NotImplementedError

    # -- a drafter over part of the target's ids
    def _target_row(self, probs: mx.array | None) -> mx.array | None:
        """q over the target's ids: the drafter's row placed at the ids its rows stand for,
        zero elsewhere (an id outside its vocabulary is never proposed, and the target's
        residual emits it with exactly the target's probability)."""
        to_target = self.draft_to_target
        if probs is None or to_target is None:
            return probs
        return mx.zeros((self.width,), dtype=probs.dtype).at[to_target].add(probs)

    def _to_target_ids(self):
        """The target id of each of the drafter's ids, on the host (a grammar's mask is in
        target ids); all of them, in order, where its ids are the target's."""
        if self.draft_to_target is None:
            return slice(None)
        if getattr(self, "_to_target_host", None) is None:
            self._to_target_host = np.array(self.draft_to_target)
        return self._to_target_host

    # -- a session's calls
    def sync(self, ids: list[int]) -> int:
        """Nothing to do until the target has read the prompt: rows follow its history."""
        return 0

    def prefill(self) -> None:
        """After the target's prefill: read the prompt's rows but the last."""
        with self._reset_on_error():
            self._ensure_features()
            self._read_behind()

    def hear(self, ids) -> None:
        """Ids emitted without the drafter are in the target's history already."""

    def catch_up_if_behind(self) -> float:
        """Before a round's marks: the target reads any pending ids but its last (the first
        draft must predict the id after that one, from true features), and the drafter reads
        a backlog of rows in a forward of its own."""
        start = time.perf_counter()
        if len(self.target.pending) > 1:  # a rewind that refeeds ids; a heard stretch
            self.target.catch_up()
        self._align()
        if self.target_rows - self.rows > CATCH_UP_AFTER:
            with self._reset_on_error():
                self._ensure_features()
                self._read_behind()
        return time.perf_counter() - start

    def begin(self, plan):
        return None

    def undo(self, state) -> None:
        self.reset()

    @contextmanager
    def _reset_on_error(self):
        """An interrupt inside a forward may leave the cache's buffers apart (keys grown,
        values not): start again from the target's features rather than trust it."""
        try:
            yield
        except BaseException:
            self.reset()
            raise

    # -- rows
    @property
    def target_rows(self) -> int:
        """Rows the target's features allow: one per position it has read."""
        return len(self.target.tokens)

    def _align(self) -> None:
        """Forget rows whose ids are no longer the target's (a rejection, a new prompt)."""
        common = common_prefix(self.ids, self.target.history)
        self._trim(min(self.rows, max(common - self.reads_ahead, 0), self.target_rows))

    def _trim(self, rows: int) -> None:
        if rows < self.rows:
            self._trim_cache(rows)
        self.ids = self.ids[: rows + self.reads_ahead] if rows else []

    def _read_behind(self) -> None:
        """Read every row the target allows but the last (a proposal reads that one)."""
        self._align()
        end = self.target_rows - 1
        if end <= self.rows:
            return
        self._read_rows(self.rows, end)
        self.ids = self.target.history[: end + self.reads_ahead]
        mx.eval(self._state())

    def _ensure_features(self) -> None:
        """The store lacks positions the target holds only where its cache came from elsewhere
        (a prompt-cache file) or where standard decoding kept none: have the target read
        them again."""
        self._align()
        # from the first row a proposal reads (the last held row again, for a drafter whose
        # row reads ahead) to the target's newest position
        first = min(self.rows, max(self.target_rows - self.reads_ahead, 0))
        if not self.target.features.covers(first, self.target_rows):
            self.reset()
            if not self.target.features.covers(0, self.target_rows):
                history = self.target.history
                self.target.invalidate(history)
                self.target.prefill()
