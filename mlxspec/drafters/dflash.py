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
(ddtree.py), through the tree path every drafter's trees take.

In a batch its cache is a lane of the batch's packed drafter cache (`join`; `PackedDFlash`
below), so every lane's block is one forward: a lane's read is the context rows the target
has read since and then its block (`BlockRead`), the block's columns forgotten once its
logits are read, as its keys are never cached alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..decoding import tree_attention
from ..decoding.carry import Carry
from ..decoding.cursor import PREFILL_STEP, TOKEN, Cursor
from ..decoding.drafter import Drafts
from ..decoding.packed import Lane, PackedCache
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

    def reset(self) -> None:
        if isinstance(getattr(self, "cache", None), Lane):  # in a batch: its lane, emptied
            self.cache.trim_to(0)
        else:
            self.cache: list | Lane = self.draft.make_cache()
        self.ids: list[int] = []  # the target's ids the rows were made from, one a row

    @property
    def rows(self) -> int:
        return self.cache.length if isinstance(self.cache, Lane) else self.cache[0].offset

    # -- a batch's calls
    def join(self, packed: PackedCache) -> None:
        """Move the rows into a lane of `packed` (a batch's DFlash cache)."""
        lane = packed.lane()
        try:
            if self.rows:
                packed.adopt(lane, [layer_cache.keys_and_values() for layer_cache in self.cache])  # the rows held
        except BaseException:
            packed.release(lane)
            raise
        self.cache = lane

    def leave(self) -> None:
        """Out of its lane, into a cache of its own holding the same rows (none, should
        copying them out fail or be interrupted: it then reads the target's features again)."""
        lane, ids, own = self.cache, self.ids, None
        try:
            copied = self.draft.make_cache()
            if lane.length:
                for layer_cache, (keys, values) in zip(copied, lane.packed.gather(lane)):
                    layer_cache.update_and_fetch(keys, values)
                mx.eval([layer_cache.state for layer_cache in copied])
            own = copied
        finally:  # out of the lane whatever happens, the row freed
            self.cache, self.ids = (own, ids) if own is not None else (self.draft.make_cache(), [])
            lane.packed.release(lane)

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
        if plan.tree and carry.grammar is None:
            return block_tree(logits[:count], budget=plan.tree, carry=carry)

        def step(i: int) -> mx.array:
            return logits[i]

        return propose_chain(
            step,
            lambda token: None,  # every position is in the block already
            count=count,
            carry=carry,
            stop_below=plan.stop_below,
            read_confidences=plan.read_confidences,
        )

    def _block(self, history: list[int], end: int) -> mx.array:
        """The rows the target read since (positions rows .. end - 1), then the block after
        them -> the logits of its mask positions, (block_size - 1, width)."""
        config = self.draft.config
        block = [history[end]] + [config.mask_token_id] * (config.block_size - 1)
        if isinstance(self.cache, Lane):  # the rows since and the block in one read of the batch's
            begin = self.rows
            features = self.target.features.read(begin, end)
            beside = mx.concatenate([features, mx.zeros((len(block), features.shape[-1]), dtype=features.dtype)])
            layout = BlockRead(start=begin, context=end - begin, block=len(block), causal=config.is_causal)
            logits, _ = self.cache.read(
                mx.array([0] * (end - begin) + block, dtype=TOKEN), layout, beside=beside, context=end - begin
            )
            # evaluated here, not where the chain reads them: left lazy, a batch's blocks
            # drafted otherwise than alone after another pair's timings had run in the
            # process (the ids stayed exact; the cause is not found yet)
            mx.eval(logits)
            self.cache.trim_to(end)  # the block's columns: never cached
            self.ids = history[:end]
            return logits[1:]
        self._read_rows(self.rows, end)
        self.ids = history[:end]
        return self.draft(mx.array(block, dtype=TOKEN)[None], self.cache)[0, 1:]

    def settle(self, state, *, drafts: Drafts, path: list[int], path_ids: list[int], next_id: int) -> None:
        """Nothing: the block's rows were never cached, and the rows the target drops with
        the rejected drafts are trimmed at the next proposal (`_align`)."""

    # -- rows (feature_rows.py)
    def _trim_cache(self, rows: int) -> None:
        if isinstance(self.cache, Lane):
            self.cache.trim_to(rows)
            return
        for layer_cache in self.cache:
            layer_cache.trim(layer_cache.offset - rows)

    def _read_rows(self, begin: int, end: int) -> None:
        if not isinstance(self.cache, Lane):
            if end > begin:
                self.draft.read_context(self.target.features.read(begin, end)[None], self.cache)
            return
        # in a batch, in chunks as the target reads a prompt: short while other lanes wait
        # (eagle3.py's reason), else the target's own steps (a read's mask grows as its square)
        step = self.cache.chunk or PREFILL_STEP
        for first in range(begin, end, step):
            last = min(first + step, end)
            layout = BlockRead(start=first, context=last - first, block=0, causal=self.draft.config.is_causal)
            features = self.target.features.read(first, last)
            self.cache.read(mx.zeros((last - first,), dtype=TOKEN), layout, beside=features, context=last - first)

    def _state(self):
        if isinstance(self.cache, Lane):
            return self.cache.state
        return [layer_cache.state for layer_cache in self.cache]


@dataclass(frozen=True)
class BlockRead:
    """A lane's read in a batch, from position `start`: `context` rows of the target's
    features, then a block of `block` ids. A block row sees every context row and the block
    (both ways, as the published drafters attend; `causal`: itself and the block rows before
    it); a context row, which no one reads the output of, what a chain would. The fields
    packed.py reads of a tree_attention.TreeLayout."""

    start: int
    context: int
    block: int
    causal: bool = False
    earlier: int = 0

    @property
    def fresh(self) -> int:
        return self.context + self.block

    @property
    def positions(self) -> list[int]:
        return list(range(self.start, self.start + self.fresh))

    def sees(self) -> np.ndarray:
        sees = np.tril(np.ones((self.fresh, self.fresh), dtype=bool))
        if not self.causal:
            sees[self.context :] = True
        return sees


class PackedDFlash:
    """A DFlash drafter as a packed cache's model (decoding/packed.py): its layers are handed
    the batch's layout and read it themselves (DFlashDraft.packed)."""

    reads_layout = True

    def __init__(self, draft: DFlashDraft):
        self.draft = draft

    def make_cache(self) -> list:
        return self.draft.make_cache()

    def why_not(self) -> str | None:
        """None where its rotary embedding places each row at its own position (a batch's
        lanes are at theirs); else why not (its lanes then draft alone)."""
        return tree_attention.why_not_rope(self.draft.layers[0].self_attn.rope)

    def __call__(self, ids: mx.array, *, cache: list, beside: mx.array, layout) -> tuple[mx.array, None]:
        return self.draft.packed(ids, beside, cache, layout), None
