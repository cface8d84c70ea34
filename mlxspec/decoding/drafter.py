"""What the round loop asks of a drafter, whatever proposes: a draft model, an EAGLE-3 head.

A round asks `catch_up_if_behind` (read a backlog in a forward of its own, outside the
round's timing), `begin` (a state to come back to), `propose` (up to `count` ids with the
distributions q they were drawn from), then `settle` (keep what the rule accepted) or, on
any exception, `undo`. Ids emitted without the drafter (plain steps, prompt lookup) are
`hear`d. `propose` draws with the round's `Carry` (sampling, a key of its own, the grammar);
under a grammar it masks each position with the matcher's state and advances it through its
own proposals (grammar.py), stopping where nothing is allowed. A session also `sync`s it to
each prompt, `prefill`s and `reset`s it. Exactness never depends on a drafter: the rule
needs only that q is what the ids were drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from .carry import Carry
from .tree import LevelPrice, TokenTree


@dataclass
class Drafts:
    ids: mx.array  # (n,) the proposals, target ids
    rows: mx.array | None  # (n, target vocab) q: the rows they were sampled from (None when greedy)
    read_all: bool  # the drafter read all of them (it stopped early), not all but the last
    confidences: mx.array | None  # (n,) its top probability at each, left on the device


@dataclass
class TreeDrafts:
    """A tree of proposals whose shape the drafter chose from its ids (on the host)."""

    tree: TokenTree  # candidates are point masses: no rows (verify.py says why)
    values: tuple[float, ...] = ()  # the drafter's probability of each node's path (its confidence)
    fed: tuple[int, ...] = ()  # each node's row in the drafter's own tree block (-1: not read)
    ranked: tuple[int, ...] = ()  # the nodes, surest first: any prefix is a tree
    # under sampling, the nodes drawn from q (a chain from the root, ranked first) and the
    # rows (len(spine), target vocab) each was drawn from at its parent
    spine: tuple[int, ...] = ()
    spine_rows: mx.array | None = None
    levels: int = 0  # levels the drafter grew, one forward each (what its drafting cost)

    def best(self, count: int) -> TreeDrafts:
        """The tree of the `count` surest nodes, renumbered in order."""
        count = max(count, len(self.spine))  # a drawn node's place never depends on its draw
        if count >= len(self.tree):
            return self
        kept = sorted(self.ranked[:count])
        number = {node: k for k, node in enumerate(kept, start=1)}
        return TreeDrafts(
            tree=self.tree.subtree(kept),
            values=tuple(self.values[n - 1] for n in kept),
            fed=tuple(self.fed[n - 1] for n in kept),
            ranked=tuple(number[n] for n in self.ranked[:count]),
            spine=tuple(number[n] for n in self.spine),
            spine_rows=self.spine_rows,  # whole: the cut above never drops a spine node
            levels=self.levels,
        )

    def depths_ranked(self) -> list[int]:
        return [self.tree.depths[n] for n in self.ranked]

    def values_ranked(self) -> list[float]:
        return [self.values[n - 1] for n in self.ranked]

    def reach(self) -> list[float]:
        """Per depth, the summed confidence of its nodes: how likely the drafter thinks it is
        that the accepted path gets that deep (at most one node per depth is on it)."""
        out = [0.0] * self.tree.depth
        for node in range(1, len(self.tree) + 1):
            out[self.tree.depths[node] - 1] += self.values[node - 1]
        return out


class Drafter(Protocol):
    name: str
    kind: str  # drafters/__init__.py's constants: a draft model, an EAGLE-3 head, an MTP head
    auto_trees: bool  # whether `--tree auto` grows its trees (drafting/shape.py decides)

    def why_no_trees(self) -> str | None: ...

    def reset(self) -> None: ...
    def sync(self, ids: list[int]) -> int: ...
    def prefill(self) -> None: ...
    def hear(self, ids) -> None: ...
    def catch_up_if_behind(self) -> float: ...
    def begin(self, count: int): ...
    def propose(self, *, count: int, carry: Carry, stop_below: float, read_confidences: bool) -> Drafts: ...
    def settle(self, state, *, drafted: list[int], accepted: int, next_id: int, read_all: bool) -> None: ...
    def undo(self, state) -> None: ...


class TreeDrafter(Drafter, Protocol):
    """A drafter that can also grow a tree of at most `budget` nodes and `depth` levels, up to
    `width` children a node (drafters/tree_growth.py), inside a state from `begin_tree`, and
    keep the accepted path of it in `settle_tree`. Where its cache cannot hold a tree (a
    recurrent state) `why_no_trees` says why, and drafting/shape.py has it draft chains."""

    def begin_tree(self, nodes: int): ...
    def propose_tree(
        self, *, depth: int, budget: int, width: int, carry: Carry, state, price: LevelPrice | None = None
    ) -> TreeDrafts | None: ...
    def settle_tree(self, state, *, drafts: TreeDrafts, path: list[int], next_id: int) -> None: ...
