"""Many sequences in one cache, read in one forward: continuous batching with per-row rollback.

A `PackedCache` is one model's KV cache with a row per *lane* (a sequence) on the batch axis
and columns shared by all rows: a forward writes every row's block at the same columns. Each
waiting lane's block (a chain of ids, or a tree) fills its row, shorter ones padded; each
query attends to its own row's live columns and to its ancestors in its block, at its own
position (the mask and rotary positions of tree_attention.py, whose wrapped attention
modules read them). A window layer (Gemma's sliding attention, or every layer under
`--max-kv-size`, whose first tokens stay in view) sees what a single step at that position
would see: the mask applies the window by position. So every lane reads exactly the context
it would read alone, and a decode step reads the weights once for all lanes: the
memory-bound shape that makes batching pay. Where every layer has the same window (a
`--max-kv-size` cache), a lane's columns that no query of it can see again are dropped too,
so its memory stays bounded as a window's does alone.

Rollback is per lane and moves no data: the columns a lane forgets (a rejected draft, a
tree's other branches, the padding of a short block) become holes that no query sees, and
are dropped when the cache is compacted (one gather per layer, when holes outgrow the live
columns, or rows are free). A lane is a `caches.ModelCache` to its cursor: the same marks,
trims and tree keeps, each exact by construction.

mlx-lm's BatchKVCache keeps rows aligned by left padding and trims every row by the same
count; vLLM packs ragged drafts into one flat batch. Rows with holes give each lane its own
length and its own rollback, at the cost of attention over the padded columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as mlx_cache

from ..errors import UnsupportedCache
from . import capture, tree_attention
from .caches import CacheRollbackError, Mark

COMPACT_SLACK = 32  # columns tolerated beyond twice the longest lane before compacting
CHUNK = 128  # prefill ids a lane reads per forward while others decode
# What one forward more costs, in ids read: a few here (a CPU's forward is compute-bound past
# a few rows); a GPU's decode step reads every weight whatever its rows, so more there
FORWARD_IDS = 8
COPIED_PER_ID = 16  # a row's columns copied (keys and values, every layer) that cost about an id read
# Under a window on every layer, a lane's unseen columns are dropped this many at a time (so the
# drop is a list cut now and then, not every step): its columns stay within the window and this
DROP_EVERY = 32
# positions below its length a lane may go back to with no mark taken (a plain step's queued id)
UNMARKED_ROLLBACK = 8


class Window(NamedTuple):
    """What a layer attends over, as a single step at position p reads it alone: the newest
    `size - keep` positions up to p, and the first `keep` (mlx-lm's RotatingKVCache)."""

    size: int
    keep: int = 0


def windows_of(model, *, max_kv_size: int | None = None) -> list[Window | None]:
    """Per layer: the window it attends over, or None (all the context), as mlx-lm builds the
    model's cache (`max_kv_size` for models that do not build their own). Raises
    UnsupportedCache where a layer's cache is neither (a recurrent state)."""
    windows = []
    for layer in mlx_cache.make_prompt_cache(model, max_kv_size):
        if type(layer) is mlx_cache.KVCache:
            windows.append(None)
        elif type(layer) is mlx_cache.RotatingKVCache:
            windows.append(Window(layer.max_size, layer.keep))
        else:
            raise UnsupportedCache(f"a {type(layer).__name__} cannot be shared by a batch")
    return windows


def why_not(model) -> str | None:
    """None when `model` can read a packed batch; else why not (the family's attention, a
    recurrent layer)."""
    if getattr(model, "reads_layout", False):  # a draft head that reads the layout itself
        return model.why_not()
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
    after the lane's columns); `beside` (n, width): what a draft head reads beside each id
    (its hidden state), None for a model that reads ids alone."""

    lane: Lane
    ids: mx.array
    layout: tree_attention.TreeLayout | None
    beside: mx.array | None = None


class PackedCache:
    """One model's cache shared by lanes, a row each; see the module's docstring."""

    def __init__(
        self,
        model,
        *,
        name: str,
        batch=None,
        taps=None,
        order: int = 0,
        kv_bits=None,
        kv_group_size: int = 64,
        max_kv_size: int | None = None,
    ):
        """`batch` (batch.Batch): where lanes' reads wait for the others' (None: each read
        runs alone); `taps`: the model's hidden-state taps (capture.py), handed out per lane;
        `order`: among the caches of a batch, lower ones run their waiting reads first (a
        drafter's before its target's, so the target reads every lane's drafts at once);
        `kv_bits`, `kv_group_size`: full-attention layers hold their keys and values
        quantized, as a lane's cache of its own would (caches.make_cache), windows as they are;
        `max_kv_size`: every layer a window of that many ids, the first 4 kept (mlx-lm's
        make_prompt_cache, for models that do not build their own cache)."""
        self.model = model
        self.name = name
        self.batch = batch
        self.taps = taps
        self.order = order
        self.kv_bits, self.kv_group_size = kv_bits, kv_group_size
        self.windows = windows_of(model, max_kv_size=max_kv_size)
        # one window over every layer: columns out of it can go (the module's docstring)
        same = self.windows and all(window == self.windows[0] for window in self.windows)
        self.bound: Window | None = self.windows[0] if same else None
        # the mask's axes before (rows, columns): one for the heads where attention is
        # mlx-lm's; gemma2 computes its own over (batch, kv heads, repeats, rows, columns)
        self._mask_axes = (slice(None), None, None) if capture.model_family(model) == "gemma2" else (slice(None), None)
        # a draft head (`reads_layout`) is handed the layout; a target's attention finds it
        self._reads_layout = getattr(model, "reads_layout", False)
        if not self._reads_layout:
            tree_attention.install(model)
        self._empty()

    def _empty(self) -> None:
        # (rows, heads, columns, dim); quantized: a (data, scales, biases) triple of such arrays
        self.layers = [_layer_cache(window, self.kv_bits, self.kv_group_size) for window in self.windows]
        self.rows: list[Lane | None] = []  # each row's lane (None: free)
        self.positions = np.zeros((0, 0), dtype=np.int64)  # (rows, columns): its position there

    @property
    def columns(self) -> int:
        return self.positions.shape[1]

    @property
    def lanes(self) -> list[Lane]:
        return [lane for lane in self.rows if lane is not None]

    def lane(self) -> Lane:
        """A new lane, in a free row or a new one."""
        free = next((r for r, lane in enumerate(self.rows) if lane is None), None)
        if free is None:
            free = len(self.rows)
            self._grow_rows()
        lane = Lane(self, free)
        self.rows[free] = lane
        return lane

    def release(self, lane: Lane) -> None:
        lane.trim_to(0)  # back into its kept ids: always, whatever it dropped
        self.rows[lane.row] = None
        if not self.lanes:  # nothing to keep: start again empty
            self._empty()

    def _grow_rows(self) -> None:
        grown = [
            (each_array(_with_row, layer.keys), each_array(_with_row, layer.values))
            for layer in self.layers
            if layer.keys is not None
        ]
        mx.eval(grown)
        for layer, (keys, values) in zip(self.layers, grown):
            layer.keys, layer.values = keys, values
        self.rows.append(None)
        self.positions = np.concatenate([self.positions, np.zeros((1, self.columns), dtype=np.int64)])

    def _grow_columns(self, count: int) -> None:
        """`count` more columns, holes in every row (the layers write theirs in the forward)."""
        rows = len(self.rows)
        self.positions = np.concatenate([self.positions, np.zeros((rows, count), dtype=np.int64)], axis=1)

    # --- one forward for many lanes ------------------------------------------------------
    def forward(self, reads: list[Read]) -> list[tuple[mx.array, mx.array | None]]:
        """Every read's block in one forward, a row each (the rows not reading read one
        padding id), but a long read beside other rows, which runs aside (`_aside`);
        returns per read (logits (n, vocab), the tapped hidden states (n, width) or None).
        On any exception no lane has changed."""
        self._compact_if_worth_it()
        answers = {}
        for read in _aside_of(reads, rows=len(self.rows)):
            answers[id(read)] = self._aside(read)
        together = [read for read in reads if id(read) not in answers]
        if together:
            answers.update(zip(map(id, together), self._together(together)))
        return [answers[id(read)] for read in reads]

    def _together(self, reads: list[Read]) -> list[tuple[mx.array, mx.array | None]]:
        before, rows = self.columns, len(self.rows)
        blocks = {read.lane.row: (read, _block(read)) for read in reads}
        width = max(len(block.positions) for _, block in blocks.values())
        ids, positions = [], np.zeros((rows, width), dtype=np.int64)
        for row in range(rows):
            if row in blocks:
                read, block = blocks[row]
                n = len(block.positions)
                ids.append(_padded(read.ids.astype(mx.uint32), width))
                positions[row, :n] = block.positions
                positions[row, n:] = block.positions[-1]
            else:
                ids.append(mx.zeros((width,), dtype=mx.uint32))
        beside = None
        if reads[0].beside is not None:  # a head's: each id's hidden state, zeros beside padding
            blank = mx.zeros((width, reads[0].beside.shape[-1]), dtype=reads[0].beside.dtype)
            beside = mx.stack(
                [_padded(blocks[row][0].beside, width) if row in blocks else blank for row in range(rows)]
            )
        layout = _PackedLayout(
            positions=positions.reshape(-1),
            masks={w: mx.array(self._mask(blocks, width, w)[self._mask_axes]) for w in set(self.windows)},
            windows={id(layer): window for layer, window in zip(self.layers, self.windows)},
        )
        try:
            logits, hidden = self._run(mx.stack(ids), self.layers, layout, beside=beside)
        except BaseException:
            for layer in self.layers:  # a layer may have taken the block: none keeps it
                layer.offset = min(layer.offset, before)
            raise
        self._grow_columns(width)
        results = []
        for read in reads:
            row = read.lane.row
            n = len(blocks[row][1].positions)
            self._extend(read.lane, before, positions[row, :n])
            results.append((logits[row, :n], None if hidden is None else hidden[row, :n]))
        return results

    def _run(
        self, ids: mx.array, cache: list, layout: _PackedLayout, *, beside: mx.array | None = None
    ) -> tuple[mx.array, mx.array | None]:
        """The model over `ids` (rows, n) and `cache` as `layout` lays them out: (logits, the
        tapped hidden states or None); a head's: (logits, its output) from ids beside `beside`."""
        if self._reads_layout:
            return self.model(ids, cache=cache, beside=beside, layout=layout)
        slot = tree_attention.install(self.model)
        slot.layout = layout
        try:
            logits = self.model(ids, cache=cache)
            return logits, self.taps.take() if self.taps is not None else None
        except BaseException:
            if self.taps is not None:
                self.taps.seen.clear()
            raise
        finally:
            slot.layout = None

    def _extend(self, lane: Lane, before: int, positions: np.ndarray) -> None:
        """The lane holds the columns from `before` on, one per position."""
        self.positions[lane.row, before : before + len(positions)] = positions
        lane.columns.extend(range(before, before + len(positions)))
        lane.length += len(positions)

    def _mask(self, blocks: dict, width: int, window: int | None) -> np.ndarray:
        """(rows, width, columns + width) bool: a block's row i sees what `_sees` says;
        padding sees itself alone (finite, and read by no one)."""
        before = self.columns
        mask = np.zeros((len(self.rows), width, before + width), dtype=bool)
        mask[:, np.arange(width), before + np.arange(width)] = True
        for row, (read, block) in blocks.items():
            n = len(block.positions)
            columns, sees = self._sees(read.lane, block, window)
            rows = mask[row]  # a view: mixed indexing below would reorder the axes
            rows[:n, columns] = sees[:, : len(columns)]
            rows[:n, before : before + n] = sees[:, len(columns) :]
        return mask

    def _sees(self, lane: Lane, block: _Block, window: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(the lane's columns, (n, columns + n) bool): block row i sees the lane's context,
        of the tree's rows read before (the lane's newest `earlier`) and of its block its
        ancestors and itself; under a window, only what a single step at its position sees."""
        columns = np.array(lane.columns, dtype=np.int64)
        n, context = len(block.positions), len(columns) - block.earlier
        sees = np.zeros((n, len(columns) + n), dtype=bool)
        sees[:, :context] = True
        sees[:, context:] = block.sees
        if window is not None:
            positions = np.concatenate([self.positions[lane.row, columns], block.positions])
            recent = block.positions[:, None] - positions[None] < window.size - window.keep
            sees &= recent | (positions[None] < window.keep)
        return columns, sees

    def _aside(self, read: Read) -> tuple[mx.array, mx.array | None]:
        """A long read (a prompt's chunk) in a forward of its own over a copy of its lane's
        row, so the other rows are not padded to its length; its keys and values then join
        the row as new columns (holes in the others)."""
        lane, block = read.lane, _block(read)
        n, row = len(block.positions), lane.row
        columns = mx.array(np.array(lane.columns, dtype=np.int64))
        aside = []
        for layer, window in zip(self.layers, self.windows):
            copy = _layer_cache(window, self.kv_bits, self.kv_group_size)
            if lane.columns:
                copy.keys, copy.values = (
                    each_array(lambda x: x[row : row + 1, :, columns, :], layer.keys),
                    each_array(lambda x: x[row : row + 1, :, columns, :], layer.values),
                )
                copy.offset = len(lane.columns)
            aside.append(copy)
        layout = _PackedLayout(
            positions=block.positions,
            masks={w: mx.array(self._sees(lane, block, w)[1]) for w in set(self.windows)},
            windows={id(copy): window for copy, window in zip(aside, self.windows)},
        )
        beside = None if read.beside is None else read.beside[None]
        logits, hidden = self._run(read.ids.astype(mx.uint32)[None], aside, layout, beside=beside)
        logits, hidden = logits[0], None if hidden is None else hidden[0]
        before, rows = self.columns, len(self.rows)

        def newest_in_row(buffer):  # the aside's n new columns, as row `row` of every row
            return each_array(lambda x: _in_row(x[..., -n:, :], row, rows), buffer)

        fresh = [tuple(map(newest_in_row, copy.keys_and_values())) for copy in aside]
        # the new keys before anything changes (the logits wait for their reader: a prompt's
        # chunk has none, so its lm_head is never computed)
        mx.eval(fresh)
        try:
            for layer, (keys, values) in zip(self.layers, fresh):
                _append(layer, keys, values, before=before)
            self._grow_columns(n)
        except BaseException:
            for layer in self.layers:  # a layer may have taken the columns: none keeps them
                layer.offset = min(layer.offset, before)
            self.positions = self.positions[:, :before]
            raise
        self._extend(lane, before, block.positions)
        return logits, hidden

    # --- holes (a lane's forgotten columns: in no lane's `columns`, so no mask shows them) --
    def _drop_unseen(self) -> None:
        """Under one window over every layer (`bound`), each lane's columns that none of its
        queries can see again become holes, DROP_EVERY or more at a time: past the first
        `keep`, the positions older than the window of the lowest position it may query
        from (`Lane.reach`)."""
        size, keep = self.bound
        for lane in self.lanes:
            unseen = lane.reach() - size + 1 - lane.dropped  # positions keep + dropped on
            if unseen >= DROP_EVERY:
                del lane.columns[keep : keep + unseen]
                lane.dropped += unseen

    def _compact_if_worth_it(self) -> None:
        """Gather every lane's columns to the front of its row and drop free rows, when holes
        outgrow the live columns (or a row is free)."""
        if self.bound is not None:
            self._drop_unseen()
        lanes = self.lanes
        longest = max((len(lane.columns) for lane in lanes), default=0)
        free = len(self.rows) - len(lanes)
        if not lanes or (self.columns <= 2 * longest + COMPACT_SLACK and not free):
            return
        if not longest:  # nothing live (lanes joined, none has read yet): free rows go, the rest is empty
            for layer in self.layers:
                layer.keys = layer.values = None
                layer.offset = 0
            self._commit([], width=0, positions=np.zeros((len(lanes), 0), np.int64), lanes=lanes)
            return
        width = longest
        index = np.zeros((len(lanes), width), dtype=np.int64)
        for i, lane in enumerate(lanes):
            index[i, : len(lane.columns)] = lane.columns
        rows = np.array([lane.row for lane in lanes])
        # everything new is built and evaluated before any of it replaces the old: an
        # interrupt in between leaves the cache as it was
        buffers = []
        if self.layers[0].keys is not None:
            take, selected = mx.array(index)[:, None, :, None], mx.array(rows)

            def compacted(x):
                return mx.take_along_axis(x[selected], take, axis=2)

            for layer in self.layers:
                buffers.append((each_array(compacted, layer.keys), each_array(compacted, layer.values)))
            mx.eval(buffers)
        live = np.arange(width)[None] < np.array([len(lane.columns) for lane in lanes])[:, None]
        positions = np.where(live, np.take_along_axis(self.positions[rows], index, axis=1), 0)
        self._commit(buffers, width=width, positions=positions, lanes=lanes)

    def _commit(self, buffers: list, *, width: int, positions: np.ndarray, lanes: list) -> None:
        """The compacted cache in place of the old: plain assignments only."""
        for layer, (keys, values) in zip(self.layers, buffers):
            layer.keys, layer.values, layer.offset = keys, values, width
        self.positions, self.rows = positions, list(lanes)
        for i, lane in enumerate(lanes):
            lane.row, lane.columns = i, list(range(len(lane.columns)))

    # --- a sequence's cache in and out ---------------------------------------------------
    def gather(self, lane: Lane) -> list[tuple[mx.array, mx.array]]:
        """Per layer, the lane's keys and values in position order (1, heads, held, dim): its
        positions 0 on, or once it dropped columns its first `keep` and its newest."""
        index = mx.array(np.array(lane.columns, dtype=np.int64))
        row = lane.row

        def taken(x):
            return x[row : row + 1, :, index, :]

        return [(each_array(taken, layer.keys), each_array(taken, layer.values)) for layer in self.layers]

    def adopt(self, lane: Lane, states: list[tuple[mx.array, mx.array]], *, length: int | None = None) -> None:
        """Write a sequence's keys and values (per layer, (1, heads, held, dim), in position
        order) into an empty lane's row, at the first columns: positions 0 on, or, for a
        sequence of `length` ids under the cache's window (`bound`), its first `keep` and its
        newest, as a wrapped window holds them."""
        if lane.length:
            raise CacheRollbackError("a lane adopts a sequence only while empty")
        held, row, rows = columns_of(states[0][0]), lane.row, len(self.rows)
        length = held if length is None else length
        keep = self.bound.keep if self.bound is not None else 0
        if length != held and (self.bound is None or not keep <= held < length):
            raise CacheRollbackError(f"{held} columns of {length} ids are not a window's")
        if self.columns < held:
            self._grow_columns(held - self.columns)
        for layer, (keys, values) in zip(self.layers, states):
            if layer.keys is None:  # the first: a buffer of every row, this one filled
                layer.keys = each_array(lambda x: mx.zeros((rows, *x.shape[1:]), dtype=x.dtype), keys)
                layer.values = each_array(lambda x: mx.zeros((rows, *x.shape[1:]), dtype=x.dtype), values)
            elif columns_of(layer.keys) < self.columns:
                layer.keys = each_array(lambda x: _with_columns(x, self.columns), layer.keys)
                layer.values = each_array(lambda x: _with_columns(x, self.columns), layer.values)
            for buffer, state in ((layer.keys, keys), (layer.values, values)):
                for into, part in zip(_parts(buffer), _parts(state)):
                    into[row : row + 1, :, :held, :] = part
            layer.offset = self.columns
        dropped = length - held
        positions = np.arange(held)
        positions[keep:] += dropped  # past the first `keep`, the newest
        self.positions[row, :held] = positions
        lane.columns = list(range(held))
        lane.length, lane.dropped = length, dropped


def _aside_of(reads: list[Read], *, rows: int) -> list[Read]:
    """The reads to run aside, each in a forward of its own: the widest ones, as many as
    lowers the ids read in all (every row padded to the widest block left, plus each aside's
    own, plus FORWARD_IDS for each forward more). So a prompt's chunk beside rows that decode
    runs aside, and prompts that arrived together are read together."""
    if rows < 2:
        return []
    wide = sorted(reads, key=lambda read: -read.ids.shape[0])
    widths = [read.ids.shape[0] for read in wide] + [1]
    # an aside costs its ids, a forward more, and the copy of its lane's row
    price = [width + FORWARD_IDS + len(read.lane.columns) // COPIED_PER_ID for width, read in zip(widths, wide)]
    cost = [rows * widths[k] + sum(price[:k]) for k in range(len(wide) + 1)]
    return wide[: min(range(len(wide) + 1), key=lambda k: cost[k])]


def _layer_cache(window: int | None, kv_bits: int | None, kv_group_size: int):
    """A packed layer's cache: quantized where a lane's own full-attention layer would be."""
    if window is None and kv_bits is not None:
        return mlx_cache.QuantizedKVCache(group_size=kv_group_size, bits=kv_bits)
    return mlx_cache.KVCache()


def _parts(buffer) -> tuple:
    """A layer's keys (or values): one array, or a quantized triple."""
    return buffer if isinstance(buffer, tuple) else (buffer,)


def each_array(change, buffer):
    """`change` applied to each array of a layer's keys (or values), their form kept: one
    array, or a quantized triple."""
    return tuple(change(x) for x in buffer) if isinstance(buffer, tuple) else change(buffer)


def columns_of(buffer) -> int:
    """The columns (ids) a layer's keys or values hold, one array or a quantized triple."""
    return _parts(buffer)[0].shape[2]


def _append(layer, keys, values, *, before: int) -> None:
    """Columns, already in the layer's form, after its first `before` (its offset): a plain
    layer writes them as a forward would; a quantized one takes them as they are, not
    quantized again (a copy of its buffers: asides are prompt chunks, not decode steps)."""
    if not isinstance(keys, tuple):
        layer.update_and_fetch(keys, values)
        return
    if layer.keys is None:
        layer.keys, layer.values = keys, values
    else:

        def joined(old, new):
            return mx.concatenate([old[..., :before, :], new], axis=2)

        layer.keys = tuple(map(joined, layer.keys, keys))
        layer.values = tuple(map(joined, layer.values, values))
    layer.offset = before + columns_of(keys)


def _padded(block: mx.array, width: int) -> mx.array:
    """`block` (n, ...) with zeros after it to `width` rows."""
    pad = width - block.shape[0]
    return block if not pad else mx.concatenate([block, mx.zeros((pad, *block.shape[1:]), dtype=block.dtype)])


def _in_row(block: mx.array, row: int, rows: int) -> mx.array:
    """(1, heads, n, dim) as row `row` of `rows`, the others zeros (holes)."""
    zeros = mx.zeros((rows, *block.shape[1:]), dtype=block.dtype)
    zeros[row : row + 1] = block
    return zeros


def _with_row(buffer: mx.array) -> mx.array:
    return mx.concatenate([buffer, mx.zeros((1, *buffer.shape[1:]), dtype=buffer.dtype)])


def _with_columns(buffer: mx.array, columns: int) -> mx.array:
    grow = (*buffer.shape[:2], columns - buffer.shape[2], buffer.shape[3])
    return mx.concatenate([buffer, mx.zeros(grow, dtype=buffer.dtype)], axis=2)


class Lane:
    """One sequence's share of a PackedCache, seen by its cursor as a caches.ModelCache whose
    every part trims exactly (holes), so a mark needs no snapshot. Under a window over every
    layer it trims back as far as its dropped columns allow (`floor`), and no further than its
    live mark: the cache drops columns only below what that mark may go back to (`reach`)."""

    needs_snapshots = False

    def __init__(self, packed: PackedCache, row: int):
        self.packed = packed
        self.row = row  # its row on the cache's batch axis
        self.columns: list[int] = []  # its positions' columns, in position order, but the dropped
        self.length = 0  # positions it holds, the dropped among them
        self.dropped = 0  # positions keep, keep + 1, ...: out of every query's window (PackedCache.bound)
        self._marked: tuple[int, int | None] | None = None  # the latest mark: its length and reads

    def read(
        self, ids: mx.array, layout: tree_attention.TreeLayout | None, *, beside: mx.array | None = None
    ) -> tuple[mx.array, mx.array | None]:
        """Read `ids` (laid out as `layout` says, None: a chain; a head's beside `beside`) with
        the batch's other lanes; returns (logits, tapped hidden states or None; a head's
        output), the lane then longer by len(ids)."""
        read = Read(self, ids, layout, beside)
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
        """`reads`: the ids the round may read past it (None: any); until it has read more, the
        lane may come back here, so no column a query from here sees is dropped."""
        self._marked = (self.length, reads)
        return Mark(self.length)

    def reach(self) -> int:
        """The lowest position a query of this lane may still be at: its live mark's (a round
        that has not read past what the mark allowed), else a few below its length."""
        low = self.length - UNMARKED_ROLLBACK
        if self._marked is not None:
            length, reads = self._marked
            if reads is None or self.length <= length + reads:
                low = min(low, length)
        return max(low, 0)

    @property
    def floor(self) -> int:
        """The least length above the kept ids it can be trimmed to: one whose next query's
        window it still holds."""
        return self.dropped + self.packed.bound.size - 1 if self.dropped else 0

    def holds(self, length: int) -> bool:
        return self.length == length == len(self.columns) + self.dropped

    def can_trim_to(self, length: int) -> bool:
        return 0 <= length <= self.length and (length >= self.floor or length <= self._kept())

    def _kept(self) -> int:
        """Ids from position 0 it holds whatever it dropped: the window's kept ones."""
        return self.packed.bound.keep if self.dropped else self.length

    def trim_to(self, length: int) -> bool:
        """False, nothing changed, where it dropped ids the next query would see (as a wrapped
        window's cache cannot go back); back to its kept ids (an empty lane too) it always can."""
        if not 0 <= length <= self.length:
            raise CacheRollbackError(f"cannot trim {self.length} tokens to {length}")
        if not self.can_trim_to(length):
            return False
        if length <= self._kept():  # nothing dropped below it
            self.dropped = 0
        del self.columns[length - self.dropped :]
        self.length = length
        return True

    def rewind(self, length: int, mark: Mark) -> int:
        if length < mark.length:
            raise CacheRollbackError(f"cannot rewind to {length}, before the mark at {mark.length}")
        self.restore(Mark(length))
        return 0

    def restore(self, mark: Mark) -> None:
        if mark.length > self.length:
            raise CacheRollbackError(f"the lane holds {self.length} tokens, fewer than the mark's {mark.length}")
        if not self.trim_to(mark.length):
            raise CacheRollbackError(f"the lane dropped the columns a query at {mark.length} would see")

    def keep_block_rows(self, count: int, kept: list[int]) -> None:
        """Keep rows `kept` (increasing) of the newest `count`: the others become holes. The
        kept rows were computed at their path's positions, so nothing moves."""
        if list(kept) != sorted(set(kept)) or (kept and not 0 <= kept[0] <= kept[-1] < count):
            raise CacheRollbackError(f"rows {kept} are not increasing rows of a {count}-row block")
        block = self.columns[len(self.columns) - count :]
        self.columns[len(self.columns) - count :] = [block[i] for i in kept]
        self.length = len(self.columns) + self.dropped


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
