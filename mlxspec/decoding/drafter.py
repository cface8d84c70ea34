"""What the round loop asks of a drafter, whatever proposes: a draft model, an EAGLE-3 or
MTP head; and the one proposal type (`Drafts`) a round verifies, a tree or a chain.

A round asks `catch_up_if_behind` (read a backlog in a forward of its own, outside the
round's timing), `begin(plan)` (a state to come back to), `propose(plan)` (the plan's
proposal: a chain of up to `plan.draft` ids with the distributions q they were drawn from,
or a tree of at most `plan.tree` nodes grown `plan.draft` levels deep: drafters/chain.py and
tree_growth.py), then `settle` (keep the accepted path: the one rollback, Cursor.keep_path)
or, on any exception, `undo`. Ids emitted without the drafter (plain steps, prompt lookup)
are `hear`d. `propose` draws with the round's `Carry` (sampling, a key of its own, the
grammar); under a grammar it masks each position with the matcher's state and advances it
through its own proposals (grammar.py), stopping where nothing is allowed. A session also
`sync`s it to each prompt, `prefill`s and `reset`s it. Whether it can grow trees at all
(`why_no_trees`, `auto_trees`) is read once, by drafting/shape.py. Exactness never depends
on a drafter: the rule needs only that q is what the ids were drawn from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from .carry import Carry
from .cursor import TOKEN
from .plan import Plan
from .tree import TokenTree


@dataclass
class Drafts:
    """A round's proposal: a tree of candidate ids hanging from the target's last pending id.
    A chain is the tree whose nodes each have one child, every one drawn from q (the chain's
    rule is the tree walk over it: tests/unit/test_tree_rule.py); its shape is known before
    its ids are, so they stay on the device until the round's one wait (`tree` None). A
    drafter's tree is chosen on the host from its ids (`tree`), its candidates point masses
    but for the nodes drawn from q (verify.py says why)."""

    ids: mx.array  # (n,) the nodes' ids in node order, target ids
    # q: the rows (drawn nodes, target vocab) the drawn nodes were sampled from at their
    # parents: a chain's every node, a tree's spine (None when greedy, or point masses)
    rows: mx.array | None = None
    read_all: bool = False  # a chain: the drafter read all of them (it stopped early), not all but the last
    confidences: mx.array | None = None  # a chain: its top probability at each, left on the device
    tree: TokenTree | None = None  # the shape, on the host (None: a chain of len(ids) nodes)
    values: tuple[float, ...] = ()  # the drafter's probability of each node's path (its confidence)
    fed: tuple[int, ...] = ()  # each node's row in the drafter's own tree block (-1: not read)
    ranked: tuple[int, ...] = ()  # the nodes, surest first: any prefix is a tree
    spine: tuple[int, ...] = ()  # a tree's nodes drawn from q (a chain from the root, ranked first)
    levels: int = 0  # levels the drafter grew, one forward each (what its drafting cost)

    @classmethod
    def of_tree(cls, tree: TokenTree, **fields) -> Drafts:
        return cls(ids=mx.array(list(tree.ids), dtype=TOKEN), tree=tree, **fields)

    @property
    def is_chain(self) -> bool:
        """A chain as drafters draw them, its ids on the device (the rule's fast path); a
        tree of point masses that happens to have one child a node is walked as a tree."""
        return self.tree is None

    def __len__(self) -> int:
        return self.ids.shape[0]

    def fed_row(self, node: int) -> int:
        """Node's row in the drafter's block after its pending ids (-1: it did not read it).
        A chain's drafter reads each draft but the last, all where it stopped early."""
        if self.tree is not None:
            return self.fed[node - 1]
        return node - 1 if node <= len(self) - (not self.read_all) else -1

    def drawn(self) -> dict[int, tuple[int, mx.array]]:
        """A tree's nodes drawn from q, as the walk takes them (verify.walk_tree): parent ->
        (its drawn child, the row it was drawn from)."""
        return {self.tree.parents[n - 1]: (n, self.rows[i]) for i, n in enumerate(self.spine)}

    def best(self, count: int) -> Drafts:
        """The tree of the `count` surest nodes, renumbered in order."""
        count = max(count, len(self.spine))  # a drawn node's place never depends on its draw
        if count >= len(self.tree):
            return self
        kept = sorted(self.ranked[:count])
        number = {node: k for k, node in enumerate(kept, start=1)}
        return Drafts.of_tree(
            self.tree.subtree(kept),
            values=tuple(self.values[n - 1] for n in kept),
            fed=tuple(self.fed[n - 1] for n in kept),
            ranked=tuple(number[n] for n in self.ranked[:count]),
            spine=tuple(number[n] for n in self.spine),
            rows=self.rows,  # whole: the cut above never drops a spine node
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
    def begin(self, plan: Plan): ...
    def propose(self, plan: Plan, *, carry: Carry, state) -> Drafts | None: ...
    def settle(self, state, *, drafts: Drafts, path: list[int], path_ids: list[int], next_id: int) -> None: ...
    def undo(self, state) -> None: ...
