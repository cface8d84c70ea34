"""Many sequences in one cache, read in one forward: continuous batching without padding.

A `PackedCache` is one model's plain KV cache (batch 1) whose columns belong to *lanes*, one
lane a sequence. A forward reads every waiting lane's block (a chain of ids, or a tree) as
one row of ids; each query attends to its own lane's columns only and to its ancestors in its
block, at its own position (the mask and rotary positions of tree_attention.py, whose wrapped
attention modules read them). A window layer (Gemma's sliding attention) sees what a single
step at that position would see: the mask applies the window by position. So every lane
reads exactly the context it would read alone, and a decode step reads the weights once for
all lanes: the memory-bound shape that makes batching pay.

Rollback is per lane and moves no data: the columns a lane forgets (a rejected draft, a
tree's other branches) become holes that no query sees, and are dropped when the cache is
compacted (one gather, when holes outgrow the live columns). A lane is a `caches.ModelCache`
to its cursor: the same marks, trims and tree keeps, each exact by construction.

This is the layout vLLM calls a flat batch of ragged rows (`cu_num_draft_tokens`); here the
ragged rows share one sequence axis, which mlx-lm's models take unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as mlx_cache

from ..errors import UnsupportedCache
from . import tree_attention
from .caches import CacheRollbackError, Mark

HOLE = -1
COMPACT_SLACK = 512  # holes tolerated before compacting, beyond as many as live columns
CHUNK = 128  # prefill ids a lane reads per forward while others decode


def windows_of(model) -> list[int | None]:
    """Per layer: the sliding window it attends over, or None (all the context). Raises
    UnsupportedCache where a layer's own cache is neither (recurrent state, kept tokens)."""
    make = getattr(model, "make_cache", None)
    layers = make() if make is not None else [mlx_cache.KVCache() for _ in model.layers]
    windows = []
    for layer in layers:
        if type(layer) is mlx_cache.KVCache:
            windows.append(None)
        elif type(layer) is mlx_cache.RotatingKVCache and not layer.keep:
            windows.append(layer.max_size)
        else:
            raise UnsupportedCache(f"a {type(layer).__name__} cannot be shared by a batch")
    return windows


def why_not(model) -> str | None:
    """None when `model` can read a packed batch; else why not (the family's attention, a
    recurrent layer)."""
    reason = tree_attention.why_not_family(model)
    if reason is not None:
        return reason
    try:
        windows_of(model)
    except UnsupportedCache as e:
        return str(e)
    return None


@dataclass
class Read:
    """A lane's block for the next forward: `ids` (n,), laid out as `layout` says (None: a chain
    after the lane's columns)."""

    lane: Lane
    ids: mx.array
    layout: tree_attention.TreeLayout | None


class PackedCache:
    """One model's cache shared by lanes; see the module's docstring."""

    def __init__(self, model, *, name: str, batch=None, taps=None, order: int = 0):
        """`batch` (batch.Batch): where lanes' reads wait for the others' (None: each read
        runs alone); `taps`: the model's hidden-state taps (capture.py), handed out per lane;
        `order`: among the caches of a batch, lower ones run their waiting reads first (a
        drafter's before its target's, so the target reads every lane's drafts at once)."""
        self.model = model
        self.batch = batch
        self.name = name
        self.taps = taps
        self.order = order
        self.windows = windows_of(model)
        self.layers = [mlx_cache.KVCache() for _ in self.windows]
        self.owner = np.zeros(0, dtype=np.int64)  # per column: its lane's number, or HOLE
        self.positions = np.zeros(0, dtype=np.int64)  # per column: its position in its lane
        self.lanes: dict[int, Lane] = {}
        self._numbers = 0
        tree_attention.install(model)

    @property
    def columns(self) -> int:
        return len(self.owner)

    def lane(self) -> Lane:
        self._numbers += 1
        lane = Lane(self, self._numbers)
        self.lanes[lane.number] = lane
        return lane

    def release(self, lane: Lane) -> None:
        lane.trim_to(0)
        self.lanes.pop(lane.number, None)
        if not self.lanes:  # nothing to keep: start again empty
            self.layers = [mlx_cache.KVCache() for _ in self.windows]
            self.owner, self.positions = self.owner[:0], self.positions[:0]

    # --- one forward for many lanes ------------------------------------------------------
    def forward(self, reads: list[Read]) -> list[tuple[mx.array, mx.array | None]]:
        """Every read's block in one forward; returns per read (logits (n, vocab), the tapped
        hidden states (n, width) or None). On any exception no lane has changed."""
        self._compact_if_worth_it()
        before = self.columns
        blocks = [_block(read) for read in reads]
        ids = mx.concatenate([read.ids.astype(mx.uint32) for read in reads])
        positions = np.concatenate([block.positions for block in blocks])
        layout = _PackedLayout(
            positions=positions,
            masks={window: mx.array(self._mask(reads, blocks, window)) for window in set(self.windows)},
            windows={id(layer): window for layer, window in zip(self.layers, self.windows)},
        )
        slot = tree_attention.install(self.model)
        slot.layout = layout
        try:
            logits = self.model(ids[None], cache=self.layers)[0]
            hidden = self.taps.take()[0] if self.taps is not None else None
        except BaseException:
            for layer in self.layers:  # a layer may have taken the block: none keeps it
                layer.offset = min(layer.offset, before)
            if self.taps is not None:
                self.taps.seen.clear()
            raise
        finally:
            slot.layout = None
        results, start = [], 0
        for read, block in zip(reads, blocks):
            n = len(block.positions)
            columns = np.arange(before + start, before + start + n)
            read.lane.columns.extend(columns.tolist())
            read.lane.length += n
            results.append((logits[start : start + n], None if hidden is None else hidden[start : start + n]))
            start += n
        self.owner = np.concatenate(
            [self.owner, np.concatenate([np.full(len(b.positions), r.lane.number) for r, b in zip(reads, blocks)])]
        )
        self.positions = np.concatenate([self.positions, positions])
        return results

    def _mask(self, reads: list[Read], blocks: list[_Block], window: int | None) -> np.ndarray:
        """(block rows, columns + block rows) bool: row i sees its lane's columns (within the
        window, by position) and its ancestors in its block."""
        before = self.columns
        total = sum(len(b.positions) for b in blocks)
        mask = np.zeros((total, before + total), dtype=bool)
        row = 0
        for read, block in zip(reads, blocks):
            n = len(block.positions)
            lane_columns = np.array(read.lane.columns, dtype=np.int64)
            context = lane_columns[: len(lane_columns) - block.earlier]
            earlier = lane_columns[len(lane_columns) - block.earlier :]
            queries = block.positions[:, None]
            sees_context = np.ones((n, len(context)), dtype=bool)
            if window is not None:
                sees_context &= queries - self.positions[context][None] < window
            mask[row : row + n, context] = sees_context
            block_columns = np.concatenate([earlier, before + row + np.arange(n)])
            block_positions = np.concatenate([self.positions[earlier], block.positions])
            sees_block = block.sees
            if window is not None:
                sees_block = sees_block & (queries - block_positions[None] < window)
            mask[row : row + n, block_columns] = sees_block
            row += n
        return mask

    # --- holes -------------------------------------------------------------------------
    def forget(self, columns: list[int]) -> None:
        self.owner[columns] = HOLE

    def _compact_if_worth_it(self) -> None:
        live = int((self.owner != HOLE).sum())
        if self.columns - live <= live + COMPACT_SLACK:
            return
        kept = np.nonzero(self.owner != HOLE)[0]
        index = mx.array(kept)
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[:, :, index, :], layer.values[:, :, index, :]
            layer.offset = len(kept)
        mx.eval([(layer.keys, layer.values) for layer in self.layers])
        renumber = np.full(self.columns, HOLE, dtype=np.int64)
        renumber[kept] = np.arange(len(kept))
        for lane in self.lanes.values():
            lane.columns = renumber[np.array(lane.columns, dtype=np.int64)].tolist()
        self.owner, self.positions = self.owner[kept], self.positions[kept]

    # --- a sequence's cache in and out ---------------------------------------------------
    def gather(self, lane: Lane) -> list[tuple[mx.array, mx.array]]:
        """Per layer, the lane's keys and values in position order (1, heads, length, dim)."""
        index = mx.array(np.array(lane.columns, dtype=np.int64))
        return [(layer.keys[:, :, index, :], layer.values[:, :, index, :]) for layer in self.layers]

    def adopt(self, lane: Lane, states: list[tuple[mx.array, mx.array]]) -> None:
        """Append a sequence's keys and values (per layer, (1, heads, length, dim), positions 0
        on) as the columns of an empty lane."""
        if lane.length:
            raise CacheRollbackError("a lane adopts a sequence only while empty")
        length = states[0][0].shape[2]
        before = self.columns
        for layer, (keys, values) in zip(self.layers, states):
            if layer.keys is not None:
                held = layer.offset
                keys = mx.concatenate([layer.keys[..., :held, :], keys], axis=2)
                values = mx.concatenate([layer.values[..., :held, :], values], axis=2)
            layer.keys, layer.values, layer.offset = keys, values, keys.shape[2]
        self.owner = np.concatenate([self.owner, np.full(length, lane.number)])
        self.positions = np.concatenate([self.positions, np.arange(length)])
        lane.columns = list(range(before, before + length))
        lane.length = length


class Lane:
    """One sequence's share of a PackedCache, seen by its cursor as a caches.ModelCache whose
    every part trims exactly (holes), so a mark needs no snapshot."""

    needs_snapshots = False

    def __init__(self, packed: PackedCache, number: int):
        self.packed = packed
        self.number = number
        self.columns: list[int] = []  # in position order
        self.length = 0

    def read(self, ids: mx.array, layout: tree_attention.TreeLayout | None) -> tuple[mx.array, mx.array | None]:
        """Read `ids` (laid out as `layout` says, None: a chain) with the batch's other lanes;
        returns (logits, tapped hidden states or None), the lane then longer by len(ids)."""
        read = Read(self, ids, layout)
        if self.packed.batch is None:
            return self.packed.forward([read])[0]
        return self.packed.batch.read(read)

    @property
    def chunk(self) -> int | None:
        """Prefill ids per forward: short while other lanes wait for each forward."""
        return CHUNK if len(self.packed.lanes) > 1 else None

    @property
    def layers(self) -> list:
        return self.packed.layers

    @property
    def kinds(self) -> list[str]:
        return ["trim"] * len(self.packed.layers)

    @property
    def state(self):
        return [(layer.keys, layer.values) for layer in self.packed.layers if layer.keys is not None]

    def mark(self, *, reads: int | None = None) -> Mark:
        return Mark(self.length)

    def holds(self, length: int) -> bool:
        return self.length == length == len(self.columns)

    def can_trim_to(self, length: int) -> bool:
        return 0 <= length <= self.length

    def trim_to(self, length: int) -> bool:
        if not 0 <= length <= self.length:
            raise CacheRollbackError(f"cannot trim {self.length} tokens to {length}")
        self.packed.forget(self.columns[length:])
        del self.columns[length:]
        self.length = length
        return True

    def rewind(self, length: int, mark: Mark) -> int:
        if length < mark.length:
            raise CacheRollbackError(f"cannot rewind to {length}, before the mark at {mark.length}")
        self.trim_to(length)
        return 0

    def restore(self, mark: Mark) -> None:
        if mark.length > self.length:
            raise CacheRollbackError(f"the lane holds {self.length} tokens, fewer than the mark's {mark.length}")
        self.trim_to(mark.length)

    def keep_block_rows(self, count: int, kept: list[int]) -> None:
        """Keep rows `kept` (increasing) of the newest `count`: the others become holes. The
        kept rows were computed at their path's positions, so nothing moves."""
        if list(kept) != sorted(set(kept)) or (kept and not 0 <= kept[0] <= kept[-1] < count):
            raise CacheRollbackError(f"rows {kept} are not increasing rows of a {count}-row block")
        block = self.columns[len(self.columns) - count :]
        keep = set(kept)
        self.packed.forget([column for i, column in enumerate(block) if i not in keep])
        self.columns[len(self.columns) - count :] = [block[i] for i in kept]
        self.length = len(self.columns)


@dataclass
class _Block:
    positions: np.ndarray  # (n,) each new row's position in its lane
    sees: np.ndarray  # (n, earlier + n) bool: a row's ancestors among the tree's rows, itself included
    earlier: int  # the lane's newest columns that are rows of this tree, read before


def _block(read: Read) -> _Block:
    n = read.ids.shape[0]
    layout = read.layout
    if layout is None:
        positions = read.lane.length + np.arange(n)
        return _Block(positions, np.tril(np.ones((n, n), dtype=bool)), 0)
    if layout.fresh != n:
        raise ValueError(f"a layout of {layout.fresh} new rows over a block of {n} ids")
    return _Block(
        np.array(layout.positions[layout.earlier :], dtype=np.int64), layout.sees()[layout.earlier :], layout.earlier
    )


class _PackedLayout:
    """What tree_attention's wrapped modules read during a packed forward: each layer's mask
    (by its window) and every row's position."""

    def __init__(self, *, positions: np.ndarray, masks: dict, windows: dict):
        self._positions = mx.array(positions.astype(np.int32))
        self._masks = masks
        self._windows = windows

    def fresh_positions(self) -> mx.array:
        return self._positions

    def mask_for(self, layer_cache) -> mx.array:
        return self._masks[self._windows[id(layer_cache)]]
