"""A separate draft model as the drafter: a cursor over its own cache that reads the ids the
target emits and proposes the next ones, one forward per id."""

from __future__ import annotations

import mlx.core as mx

from ..decoding.carry import Carry
from ..decoding.cursor import TOKEN, Cursor
from ..decoding.drafter import Drafts
from ..decoding.plan import Plan
from ..decoding.tree import LevelPrice
from . import DRAFT_MODEL
from .chain import propose_chain


class ModelDrafter(Cursor):
    kind = DRAFT_MODEL

    def begin(self, plan: Plan):
        # the draft reads its pending ids and the rows the plan may draft
        return self.cache.mark(reads=len(self.pending) + plan.drafter_rows), list(self.pending)

    def propose(self, plan: Plan, *, carry: Carry, state) -> Drafts | None:
        """The plan's proposal: a tree (`plan.tree`) or a chain (None: nothing to grow)."""
        if plan.tree:
            return self._grow_tree(
                depth=plan.draft, budget=plan.tree, width=plan.width, carry=carry, state=state, price=plan.tree_price
            )
        return self._chain(
            count=plan.draft, carry=carry, stop_below=plan.stop_below, read_confidences=plan.read_confidences
        )

    def _chain(self, *, count: int, carry: Carry, stop_below: float, read_confidences: bool) -> Drafts:
        """Up to `count` ids. It reads its pending ids first and each draft but the last after.

        Confidence is the draft's top probability for the id it proposes next. `stop_below` > 0
        stops early when it falls below: those are the proposals most often rejected. Deciding
        needs the value on the host, one wait per draft step. The rule stays exact: when to
        stop depends on the draft alone, never on the target.

        Under the carry's grammar each step is drawn from the logits masked by the matcher's state,
        which then reads the id drawn (one wait per step; the mask is computed while the
        forward runs); drafting stops where the grammar allows nothing the draft can say."""
        inputs = [mx.array(self.pending, dtype=TOKEN)]  # what the next step reads
        self.pending, self.heard = [], 0

        def step(i: int) -> mx.array:
            return self.forward(inputs[0])[-1]

        def feed(token: mx.array) -> None:
            inputs[0] = token[None]

        return propose_chain(
            step,
            feed,
            count=count,
            carry=carry,
            stop_below=stop_below,
            read_confidences=read_confidences,
        )

    # --tree auto drafts its chains: a level reads the frontier through all its layers
    auto_trees = False
    # (why_no_trees, the cursor's: any cache of attention layers reads a tree; a plain one
    # keeps a tree's earlier levels where the later ones read them, a window reads the whole
    # tree again at each level, below; a recurrent state cannot branch)

    def _grow_tree(
        self,
        *,
        depth: int,
        budget: int,
        width: int,
        carry: Carry,
        state,
        price: LevelPrice | None = None,
    ) -> Drafts | None:
        """A tree grown EAGLE-2's way (tree_growth.py): the pending ids read as a chain, then
        each level's frontier read in one forward, every node at its depth's position seeing
        its ancestors only. The levels stay in the cache until `settle` keeps the path.

        A plain cache reads each level after the ones before it. A sliding window cannot: a
        block's update keeps a window's worth of the newest rows before it, and the earlier
        levels' branches would push out context a node still sees. There each level goes
        back to the round's mark (`state`) and reads the pending ids and the whole tree so
        far again, in one block, as the target reads its tree."""
        from ..decoding import tree_attention
        from .tree_growth import grow_tree

        mark, pending = state
        incremental = all(kind == "trim" for kind in self.cache.kinds)
        inputs = mx.array(self.pending, dtype=TOKEN)
        self.pending, self.heard = [], 0
        first = self.forward(inputs)[-1]
        start = self.cache.length  # the first level's position: the root's, plus one

        def expand(growth, frontier: list[int]) -> mx.array:
            ids = [growth.candidates[c].token for c in growth.fed_order]
            if incremental:
                layout = tree_attention.TreeLayout.from_parents(
                    start=start, parents=growth.block_parents(), earlier=len(ids) - len(frontier)
                )
                with tree_attention.reading(self.model, layout):
                    return self.forward(mx.array(ids[-len(frontier) :], dtype=TOKEN))
            self.cache.restore(mark)
            tree = [p + 1 for p in growth.block_parents()]  # tree numbering: 0 the root
            layout = tree_attention.TreeLayout.chain_then_tree(
                start=mark.length, pending=len(pending), tree_parents=tuple(tree)
            )
            with tree_attention.reading(self.model, layout):
                logits = self.forward(mx.array(pending + ids, dtype=TOKEN))
            return logits[-len(frontier) :]

        return grow_tree(
            first,
            expand,
            depth=depth,
            width=width,
            budget=budget,
            carry=carry,
            price=price,
        )

    def settle(self, state, *, drafts: Drafts, path: list[int], path_ids: list[int], next_id: int) -> None:
        """Keep the pending ids it read and the nodes of the accepted path it read (a chain's:
        all its drafts but the last, or all where it stopped early); the rest of the path and
        the next id become its pending ids."""
        mark, pending = state
        read = [drafts.fed_row(node) for node in path]
        read = read[: next((i for i, row in enumerate(read) if row < 0), len(read))]
        again = self.keep_path(
            block=self.cache.length - mark.length,
            kept=list(range(len(pending))) + [len(pending) + row for row in read],
            ids=pending + path_ids[: len(read)],
            mark=mark,
        )
        self.pending = again + path_ids[len(read) :] + [next_id]

    def undo(self, state) -> None:
        mark, pending = state
        self.abandon(mark, pending)
