"""A DFlash block drafter (dflash_model.py) as the drafter: one forward drafts a chain.

Its cache holds one context row per position the target has read, made from the target's
features there (the cursor's FeatureStore; the bookkeeping is feature_rows.py's, a row
reading no id ahead). A proposal reads the rows the target has read since, then the block:
the target's newest id (pending, at its own position) and `block_size - 1` mask ids, all in
ONE forward, as z-lab/dflash's `stream_generate` (dflash/model_mlx.py) and `dflash_generate`
(dflash/model.py) draft. The block's keys are never cached, so a rejection leaves nothing to
roll back but the rows the target itself forgets, which the next proposal trims.

Block position i (i >= 1) carries the drafter's distribution for the id at that position.
The chain takes the first γ of them (γ at most block_size - 1): greedy, each one's argmax;
sampling, each id drawn from its own position's warped distribution, independently of the
others, so the distribution it was drawn from given the drafts before it is that row, which
is the q the standard rule divides by (exact, as the reference's `_rejection_sample` takes
it). The whole block is always run (the published drafters attend both ways within it, so a
shorter block would change every position's distribution). Trees: DDTree over the same rows
(ddtree.py), through the tree path every drafter's trees take. A drafter over a draft
vocabulary (dflash_model.py) proposes its ids' target ids, its rows placed at them as an
EAGLE-3 head's are (feature_rows.py).

In a batch its cache is a lane of the batch's packed drafter cache (`join`; `PackedBlock`
below, decoding/packed.py), so every lane's block is one forward. A lane's read is its block
first, then the context rows it reads with it (each at its own position; the block sees
its lane's context, those rows and itself, as alone); afterwards the lane forgets the
block's columns (holes, which the packed cache compacts away), so it holds the context rows
alone, as the cache alone does. A read with no block to draft (a prompt's rows) carries a
block of mask ids whose logits nobody reads, so every read has the same shape.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..decoding.carry import Carry
from ..decoding.cursor import TOKEN, Cursor
from ..decoding.drafter import Drafts
from ..decoding.packed import Lane
from ..decoding.plan import Plan
from . import DFLASH
from .chain import propose_chain, stack_drafts
from .ddtree import block_tree
from .dflash_model import DFlashDraft
from .feature_rows import FeatureRows


class DFlashDrafter(FeatureRows):
    kind = DFLASH
    reads_ahead = 0  # a context row is the target's features alone
    auto_trees = True  # a tree of any size costs the one forward a chain does

    def __init__(self, draft: DFlashDraft, target: Cursor, *, name: str):
        self.draft = draft
        super().__init__(target, name=name)

    # -- its own cache (feature_rows.py): a layer's each
    def _own_cache(self, states: list | None = None) -> list:
        cache = self.draft.make_cache()
        for layer_cache, (keys, values) in zip(cache, states or []):
            layer_cache.update_and_fetch(keys, values)
        if states:
            mx.eval([layer_cache.state for layer_cache in cache])
        return cache

    def _own_states(self) -> list:
        return [layer_cache.keys_and_values() for layer_cache in self.cache]

    def _own_rows(self) -> int:
        return self.cache[0].offset

    def _trim_own(self, rows: int) -> None:
        for layer_cache in self.cache:
            layer_cache.trim(layer_cache.offset - rows)

    def why_no_trees(self) -> str | None:
        """None: DDTree turns the block's distributions into a tree (ddtree.py)."""
        return None

    # -- a round's calls
    def propose(self, plan: Plan, *, carry: Carry, state=None) -> Drafts | None:
        """From one forward of the block: a DDTree of at most `plan.tree` nodes (ddtree.py),
        or a chain of up to `plan.draft` ids; at most block_size - 1 deep either way. Under a
        grammar, a chain (each position masked after the drafts before it)."""
        self._align()
        end = self.target_rows
        history = self.target.history
        count = min(plan.draft, self.draft.config.block_size - 1)
        if end == 0 or len(history) <= end or count < 1:  # nothing read to draft beside
            return stack_drafts([], [], [], params=carry.params, stopped=False, read_confidences=plan.read_confidences)
        logits = self._block(history, end)
        to_target = self.draft_to_target
        if plan.tree and carry.grammar is None:
            host = None if to_target is None else self._to_target_ids()
            return block_tree(logits[:count], budget=plan.tree, carry=carry, to_target=host, to_row=self._target_row)

        def step(i: int) -> mx.array:
            return logits[i]

        return propose_chain(
            step,
            lambda token: None,  # every position is in the block already
            count=count,
            carry=carry,
            stop_below=plan.stop_below,
            read_confidences=plan.read_confidences,
            to_target=to_target,
            target_ids=self._to_target_ids() if carry.grammar is not None else slice(None),
            target_row=self._target_row,
        )

    @property
    def draft_to_target(self) -> mx.array | None:
        return self.draft.draft_to_target

    def _block(self, history: list[int], end: int) -> mx.array:
        """The rows the target read since (positions rows .. end - 1), then the block after
        them -> the logits of its mask positions, (block_size - 1, its vocabulary)."""
        config = self.draft.config
        block = [history[end]] + [config.mask_token_id] * (config.block_size - 1)
        if isinstance(self.cache, Lane):  # the last rows and the block in one read
            last = max(self.rows, end - self._lane_step())
            self._read_rows(self.rows, last)
            logits = self._lane_read(last, end, block=block)
        else:
            self._read_rows(self.rows, end)
            logits = self.draft(mx.array(block, dtype=TOKEN)[None], self.cache)[0]
        self.ids = history[:end]
        return logits[1:]

    def settle(self, state, *, drafts: Drafts, path: list[int], path_ids: list[int], next_id: int) -> None:
        """Nothing: the block's rows were never cached, and the rows the target drops with
        the rejected drafts are trimmed at the next proposal (`_align`)."""

    # -- rows (feature_rows.py)
    def _read_rows(self, begin: int, end: int) -> None:
        if end <= begin:
            return
        if not isinstance(self.cache, Lane):
            self.draft.read_context(self.target.features.read(begin, end)[None], self.cache)
            return
        # in chunks as the target reads a prompt: lanes that arrive together read theirs in
        # one forward, padded to the longest chunk, not to the longest prompt
        step = self._lane_step()
        for first in range(begin, end, step):
            self._lane_read(first, min(first + step, end), block=None)

    def _lane_read(self, begin: int, end: int, *, block: list[int] | None) -> mx.array:
        """In a batch: the block (None: mask ids, read for the shape alone) and the rows
        begin .. end - 1 in one read with the other lanes' -> the block's logits; the lane
        then holds the rows alone."""
        size = self.draft.config.block_size
        ids = (block or [self.draft.config.mask_token_id] * size) + [0] * (end - begin)
        features = self.target.features.read(begin, end)
        beside = mx.concatenate([mx.zeros((size, features.shape[-1]), dtype=features.dtype), features])
        layout = BlockRead(context=range(begin, end), block_at=end, size=size, causal=self.draft.config.is_causal)
        try:
            logits, _ = self.cache.read(mx.array(ids, dtype=TOKEN), layout, beside=beside)
            self.cache.keep_block_rows(size + end - begin, list(range(size, size + end - begin)))
        except BaseException:  # a read half done (an interrupt): start again from the features
            self.reset()
            raise
        return logits

    def _state(self):
        if isinstance(self.cache, Lane):
            return self.cache.state
        return [layer_cache.state for layer_cache in self.cache]


class BlockRead:
    """A lane's read in a batch's packed drafter cache (decoding/packed.py reads `positions`,
    `earlier`, `fresh` and `sees`, as a tree's layout): the block (`size` rows at positions
    block_at ..), then the context rows (their own positions). The block sees the new rows
    and itself, both ways (or causally, as the drafter's config says); a context row sees
    itself alone, its output never read. Before them all, every row sees the lane's context."""

    earlier = 0

    def __init__(self, *, context: range, block_at: int, size: int, causal: bool):
        self.positions = [block_at + i for i in range(size)] + list(context)
        self.size = size
        self.causal = causal

    @property
    def fresh(self) -> int:
        return len(self.positions)

    def sees(self) -> np.ndarray:
        sees = np.eye(self.fresh, dtype=bool)
        block = np.tril(np.ones((self.size, self.size), dtype=bool)) if self.causal else True
        sees[: self.size, : self.size] = block
        sees[: self.size, self.size :] = True
        return sees


class PackedBlock:
    """A DFlash drafter as a batch's packed cache's model (decoding/packed.py): each row
    reads its block and context rows (BlockRead) beside the features of those rows."""

    reads_layout = True

    def __init__(self, draft: DFlashDraft):
        self.draft = draft

    def make_cache(self) -> list:
        return self.draft.make_cache()

    def why_not(self) -> str | None:
        return self.draft.why_not_packed()

    def __call__(self, ids: mx.array, *, cache: list, beside: mx.array, layout) -> tuple[mx.array, None]:
        return self.draft.read_packed(ids, beside, cache, layout), None
