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
"""

from __future__ import annotations

import mlx.core as mx

from ..decoding.carry import Carry
from ..decoding.cursor import TOKEN, Cursor
from ..decoding.drafter import Drafts
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
        self.cache = self.draft.make_cache()
        self.ids: list[int] = []  # the target's ids the rows were made from, one a row

    @property
    def rows(self) -> int:
        return self.cache[0].offset

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
        self._read_rows(self.rows, end)
        self.ids = history[:end]
        config = self.draft.config
        block = mx.array([history[end]] + [config.mask_token_id] * (config.block_size - 1), dtype=TOKEN)[None]
        return self.draft(block, self.cache)[0, 1:]

    def settle(self, state, *, drafts: Drafts, path: list[int], path_ids: list[int], next_id: int) -> None:
        """Nothing: the block's rows were never cached, and the rows the target drops with
        the rejected drafts are trimmed at the next proposal (`_align`)."""

    # -- rows (feature_rows.py)
    def _trim_cache(self, rows: int) -> None:
        for layer_cache in self.cache:
            layer_cache.trim(layer_cache.offset - rows)

    def _read_rows(self, begin: int, end: int) -> None:
        if end > begin:
            self.draft.read_context(self.target.features.read(begin, end)[None], self.cache)

    def _state(self):
        return [layer_cache.state for layer_cache in self.cache]
