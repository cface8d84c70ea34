"""An EAGLE-3 head as the drafter: it reads the target's own hidden states.

The head's row j reads token j+1 beside the target's features at position j and predicts
token j+2 (eagle3_head.py). The target writes the features of every position it reads into
its cursor's FeatureStore, so the head follows the target's history instead of keeping ids
of its own (the bookkeeping every feature drafter shares: feature_rows.py): before proposing
it reads a row for each position the target has read since, the last of which predicts the
id after the target's pending one, which is exactly the first id a verify places. Then it
chains on its own output for the rest. Rows it made from its own outputs are thrown away
when the round settles: next round it reads the target's true features for whatever was
accepted (as EAGLE's and vLLM's implementations do).

The head's KV cache is plain, so forgetting rows is a trim. In a batch it is a lane of the
batch's packed head cache (`join`, decoding/packed.py: `PackedHead`), so every lane's draft
step is one forward of the head. After an interruption the head starts again from the
target's features, which the store keeps for everything the target's cache holds. q is the
head's warped distribution over its draft vocabulary placed at the target ids its rows
stand for, zero elsewhere: an id outside the draft vocabulary is never proposed but is
still emitted with exactly the target's probability.
"""

from __future__ import annotations

import mlx.core as mx

from ..decoding.carry import Carry
from ..decoding.cursor import TOKEN, Cursor
from ..decoding.drafter import Drafts
from ..decoding.packed import Lane
from ..decoding.plan import Plan
from ..decoding.tree import LevelPrice
from . import EAGLE3
from .chain import propose_chain, stack_drafts
from .eagle3_head import Eagle3Head
from .feature_rows import FeatureRows


class Eagle3Drafter(FeatureRows):
    kind = EAGLE3
    reads_ahead = 1  # row j reads id j + 1 beside the features at j

    def __init__(self, head: Eagle3Head, target: Cursor, *, name: str):
        self.head = head
        super().__init__(target, name=name)

    # -- its own cache (feature_rows.py): one layer's
    def _own_cache(self, states: list | None = None):
        from mlx_lm.models.cache import KVCache

        cache = KVCache()
        for keys, values in states or []:
            cache.update_and_fetch(keys, values)
        if states:
            mx.eval(cache.state)
        return cache

    def _own_states(self) -> list:
        return [self.cache.keys_and_values()]  # the rows held, not the buffer's spare

    def _own_rows(self) -> int:
        return self.cache.offset

    def _trim_own(self, rows: int) -> None:
        self.cache.trim(self.cache.offset - rows)

    def _forward(self, tokens: mx.array, hidden: mx.array, *, chained: bool = False, layout=None):
        """The head over `tokens` (1, n) beside `hidden` (1, n, ·), its cache one longer per
        token: (logits (1, n, vocab), output (1, n, hidden)). In a lane: with the batch's
        other lanes, each read beside its fused features (or its own last output)."""
        if not isinstance(self.cache, Lane):
            return self.head(tokens, hidden, self.cache, chained=chained, layout=layout)
        fuse = getattr(self.head, "fuse", None)  # an MTP head reads its inputs as they are
        beside = hidden[0] if chained or fuse is None else fuse(hidden[0])
        logits, out = self.cache.read(tokens[0], layout, beside=beside)
        return logits[None], out[None]

    # -- a round's calls
    def propose(self, plan: Plan, *, carry: Carry, state=None) -> Drafts | None:
        """The plan's proposal: a tree (`plan.tree`; None: nothing to draft from) or a chain."""
        if plan.tree:
            return self._grow_tree(
                depth=plan.draft, budget=plan.tree, width=plan.width, carry=carry, price=plan.tree_price
            )
        return self._chain(
            count=plan.draft, carry=carry, stop_below=plan.stop_below, read_confidences=plan.read_confidences
        )

    def _chain(self, *, count: int, carry: Carry, stop_below: float, read_confidences: bool) -> Drafts:
        """Up to `count` ids, the first from the rows for the target's newest positions, the
        rest chained on the head's own output."""
        self._align()
        end = self.target_rows
        if end == 0:  # a one-id prompt: no position read, nothing to draft from
            return stack_drafts([], [], [], params=carry.params, stopped=False, read_confidences=read_confidences)
        if self.rows >= end:  # nothing new: read the last row again for its output
            self._trim(end - 1)
        history = self.target.history
        begin = self.rows
        tokens = mx.array(history[begin + 1 : end + 1], dtype=TOKEN)[None]
        hidden = self.target.features.read(begin, end)[None]
        self.ids = history[: end + 1]
        reads = {"tokens": tokens, "hidden": hidden, "out": None}  # what the next step reads

        def step(i: int) -> mx.array:
            logits, reads["out"] = self._forward(reads["tokens"], reads["hidden"], chained=i > 0)
            return logits[0, -1]

        def feed(token: mx.array) -> None:  # chained on its own output
            reads["tokens"], reads["hidden"] = token.reshape(1, 1), reads["out"][:, -1:]

        masked_at = self._to_target_ids() if carry.grammar is not None else slice(None)  # the mask at the head's ids
        return propose_chain(
            step,
            feed,
            count=count,
            carry=carry,
            stop_below=stop_below,
            read_confidences=read_confidences,
            to_target=self.draft_to_target,
            target_ids=masked_at,
            target_row=self._target_row,
        )

    auto_trees = True  # a level costs one forward of one layer

    def why_no_trees(self) -> str | None:
        return self.head.why_no_trees()

    def _grow_tree(
        self, *, depth: int, budget: int, width: int, carry: Carry, price: LevelPrice | None
    ) -> Drafts | None:
        """A tree of at most `budget` nodes and `depth` levels, grown EAGLE-2's way
        (tree_growth.py): the first level from the rows for the target's newest positions,
        then `width` children for each of the `width` surest frontier nodes per level, each
        level read in one forward of the head over its cache, each node attending to the
        context and its own ancestors. None when there is nothing to draft from."""
        from ..decoding.tree_attention import TreeLayout
        from .tree_growth import grow_tree

        self._align()
        end = self.target_rows
        if end == 0:
            return None
        if self.rows >= end:
            self._trim(end - 1)
        history = self.target.history
        begin = self.rows
        tokens = mx.array(history[begin + 1 : end + 1], dtype=TOKEN)[None]
        hidden = self.target.features.read(begin, end)[None]
        self.ids = history[: end + 1]
        logits, out = self._forward(tokens, hidden)
        outs = {-1: out[:, -1:]}  # what each fed candidate's children read as their hidden state

        def expand(growth, frontier: list[int]) -> mx.array:
            layout = TreeLayout.from_parents(
                start=end, parents=growth.block_parents(), earlier=len(growth.fed_order) - len(frontier)
            )
            step_tokens = mx.array([growth.candidates[c].token for c in frontier], dtype=TOKEN)[None]
            step_hidden = mx.concatenate([outs[growth.candidates[c].parent] for c in frontier], axis=1)
            step_logits, step_out = self._forward(step_tokens, step_hidden, chained=True, layout=layout)
            for i, c in enumerate(frontier):
                outs[c] = step_out[:, i : i + 1]
            return step_logits[0]

        to_target = None if self.draft_to_target is None else self._to_target_ids()
        return grow_tree(
            logits[0, -1],
            expand,
            depth=depth,
            width=width,
            budget=budget,
            carry=carry,
            to_target=to_target,
            to_row=self._target_row,
            price=price,
        )

    @property
    def draft_to_target(self) -> mx.array | None:
        return self.head.draft_to_target

    def settle(self, state, *, drafts: Drafts, path: list[int], path_ids: list[int], next_id: int) -> None:
        """Keep the rows read from the target's features; drop those made from its own
        outputs (a chain's chained rows, a tree's every row)."""
        self._trim(min(self.rows, max(len(self.ids) - 1, 0)))

    # -- rows (feature_rows.py)
    def _read_rows(self, begin: int, end: int) -> None:
        # in a batch, in chunks as the target reads a prompt: lanes that arrive together read
        # theirs in one forward, padded to the longest chunk, not to the longest prompt
        step = self._lane_step() if isinstance(self.cache, Lane) else max(end - begin, 1)
        for first in range(begin, end, step):
            last = min(first + step, end)
            tokens = mx.array(self.target.history[first + 1 : last + 1], dtype=TOKEN)[None]
            self._forward(tokens, self.target.features.read(first, last)[None])

    def _state(self):
        return self.cache.state


class PackedHead:
    """A draft head as a packed cache's model (decoding/packed.py): its one attention layer
    is handed the batch's layout (rows' positions and masks) and reads it itself; each id is
    read beside its hidden state (an EAGLE-3 head's fused features or its own last output)."""

    reads_layout = True

    def __init__(self, head):
        self.head = head

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache()]

    def why_not(self) -> str | None:
        return self.head.why_no_trees()  # its rotary embedding places rows at their own positions, or not

    def __call__(self, ids: mx.array, *, cache: list, beside: mx.array, layout) -> tuple[mx.array, mx.array]:
        return self.head(ids, beside, cache[0], chained=True, layout=layout)
