"""Growing a draft tree from a drafter's distributions, EAGLE-2's way (Li et al., arXiv
2406.16858): expand, a few at a time, the frontier nodes the drafter is most sure of (the
product of its probabilities along the path), then keep the best nodes of everything
grown, up to a budget.

At temperature 0 a node's children are the drafter's most probable ids there, and the rule
(verify.py) follows the target's argmax: any shape, however chosen, is exact. Under sampling
the tree has a *spine*: from the root down, one child of each spine node drawn from the
drafter's warped q there (a chain, as a chain drafter draws it), which the rule accepts with
min(1, p/q); every other child is one of the drafter's most probable ids, a point mass the
rule follows where the target's draw from what is left names it. A drawn child's place in
the tree must not depend on what was drawn (or the rule would see a biased sample), so the
spine is grown first and kept whole, and only point masses compete for the rest of the
budget. A node kept needs its parent, which a score along the path ensures (a child is
never surer than its parent); siblings are kept most probable first.

Host bookkeeping on plain values; the drafter's forward and the draws stay with the caller
(one host wait per depth, for the ids chosen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..decoding.carry import Carry
from ..decoding.drafter import Drafts
from ..decoding.sampling import SamplingParams, constrain, sample, warp
from ..decoding.tree import LevelPrice, TokenTree


@dataclass
class Candidate:
    parent: int  # index of the parent candidate, -1: the root
    token: int  # target id
    choice: int  # the drafter's own id (its vocabulary may be a subset of the target's)
    depth: int
    score: float  # log of the drafter's probability of the path (its warped q along it)
    rank: int  # among its siblings, most probable first (a drawn child first)
    fed: int = -1  # its row in the drafter's tree block, once the drafter has read it
    drawn: bool = False  # on the spine: drawn from q, whose row at its parent is kept
    # on the chain of first children from the root (the drafter's own chain; under sampling
    # the spine): the controller learns a chain's rates from it, so it is always expanded
    first: bool = False


@dataclass
class Growth:
    """Every candidate grown this round."""

    candidates: list[Candidate] = field(default_factory=list)
    spine: list[int] = field(default_factory=list)  # the drawn candidates, root side first
    spine_rows: list[mx.array] = field(default_factory=list)  # q each was drawn from, (drafter vocab,)
    fed_order: list[int] = field(default_factory=list)  # candidates in the order the drafter read them

    def add_children(
        self, parent: int, choices: list[int], logps: list[float], to_target, *, drawn: tuple | None = None
    ) -> None:
        """Children of `parent`, most probable first, with the drafter's log q of each;
        `drawn` (id, log q, q row): a child drawn from q, first, and the others without it."""
        base = 0.0 if parent < 0 else self.candidates[parent].score
        depth = 1 if parent < 0 else self.candidates[parent].depth + 1
        on_first = parent < 0 or self.candidates[parent].first
        if drawn is not None:
            choice, logp, row = drawn
            token = choice if to_target is None else int(to_target[choice])
            self.spine.append(len(self.candidates))
            self.spine_rows.append(row)
            self.candidates.append(Candidate(parent, token, choice, depth, base + logp, 0, drawn=True, first=on_first))
            others = [(c, lp) for c, lp in zip(choices, logps) if c != choice][: len(choices) - 1]
            choices, logps = [c for c, _ in others], [lp for _, lp in others]
        for rank, (choice, logp) in enumerate(zip(choices, logps), start=int(drawn is not None)):
            if not math.isfinite(logp):
                break  # nothing more it would say (a warped row narrower than the width asked)
            token = choice if to_target is None else int(to_target[choice])
            self.candidates.append(
                Candidate(parent, token, choice, depth, base + logp, rank, first=on_first and rank == 0)
            )

    def path(self, candidate: int) -> list[int]:
        """The candidates from the root's child down to `candidate`."""
        out = []
        while candidate >= 0:
            out.append(candidate)
            candidate = self.candidates[candidate].parent
        return out[::-1]

    def at_depth(self, depth: int) -> list[int]:
        return [i for i, c in enumerate(self.candidates) if c.depth == depth]

    def frontier(self, depth: int, count: int) -> list[int]:
        """The `count` candidates at `depth` to expand next: the spine's, the first choices'
        (at temperature 0 the same as a chain's draft), then those the drafter is surest of."""

        def key(i: int):
            candidate = self.candidates[i]
            return (not candidate.drawn, not candidate.first, -candidate.score, i)

        return sorted(sorted(self.at_depth(depth), key=key)[:count])

    def feed(self, nodes: list[int]) -> None:
        """Mark `nodes` read by the drafter, in this order, after those read before."""
        for node in nodes:
            self.candidates[node].fed = len(self.fed_order)
            self.fed_order.append(node)

    def block_parents(self) -> list[int]:
        """The parent row of every row read so far (-1: the context)."""
        return [
            -1 if self.candidates[n].parent < 0 else self.candidates[self.candidates[n].parent].fed
            for n in self.fed_order
        ]

    def ranked(self) -> list[int]:
        """Every candidate, the spine first, then surest first: any prefix holds each node's
        parent (a child is never surer than its parent, and comes after it)."""
        return sorted(
            range(len(self.candidates)), key=lambda i: (not self.candidates[i].drawn, -self.candidates[i].score, i)
        )

    def tree(self, kept: list[int]) -> tuple[TokenTree, list[float]]:
        """The tree of the kept candidates (numbered as kept: parents first) and each node's
        value, the drafter's probability of its path."""
        number = {-1: 0} | {c: k for k, c in enumerate(kept, start=1)}
        parents = tuple(number[self.candidates[c].parent] for c in kept)
        ids = tuple(self.candidates[c].token for c in kept)
        return TokenTree(parents, ids), [math.exp(self.candidates[c].score) for c in kept]


def grow_tree(
    first: mx.array,
    expand,
    *,
    depth: int,
    width: int,
    budget: int,
    carry: Carry,
    to_target=None,
    to_row=lambda row: row,
    price: LevelPrice | None = None,
) -> Drafts | None:
    """Grow a tree from `first` (vocab,), the drafter's logits after the root; `expand(growth,
    frontier)` reads the frontier candidates (marked fed, in order) and returns their logits
    (len(frontier), vocab). `to_target`: the target id of each drafter id (host), None when
    they are the same; `to_row` places a q row on the target's ids. Under the carry's grammar
    (grammar.Matcher) each node's children are ids it allows after the node's path (a path
    it refuses grows nothing). `price`: a level is read only while the frontier it would
    expand may add the tokens its drafting and verifying cost (LevelPrice); None: every level."""
    params, grammar = carry.params, carry.grammar
    growth, frontier, rows = Growth(), [-1], first[None]
    keys = None if params.greedy else mx.random.split(carry.key, depth)
    levels = 0
    for level in range(depth):
        levels += 1
        if grammar is not None:
            rows = constrain(rows, _masks(growth, frontier, grammar, to_target))
        choices, logps = top_children(rows, params, width)
        on_spine = next((i for i, c in enumerate(frontier) if c < 0 or growth.candidates[c].drawn), None)
        draw = None
        if keys is not None and on_spine is not None:  # the spine's next id, drawn from q
            q = warp(rows[on_spine], params)
            token = sample(q, keys[level])
            mx.eval(choices, logps, token)
            value = token.item()
            draw = (value, math.log(max(q[value].item(), 1e-30)), q)
            if not q[value].item() > 0:  # a row the grammar closed: nothing to draw
                draw = None
        else:
            mx.eval(choices, logps)
        for i, parent in enumerate(frontier):
            drawn = draw if i == on_spine else None
            growth.add_children(parent, choices[i].tolist(), logps[i].tolist(), to_target, drawn=drawn)
        if level + 1 == depth:
            break
        frontier = growth.frontier(level + 1, width)
        if not frontier:
            break
        values = [math.exp(growth.candidates[c].score) for c in frontier]
        if price is not None and not price.pays(depth=level + 2, values=values):
            break
        growth.feed(frontier)
        rows = expand(growth, frontier)
    ranked = growth.ranked()[:budget]
    if not ranked:
        return None
    kept = sorted(ranked)
    tree, values = growth.tree(kept)
    number = {c: k for k, c in enumerate(kept, start=1)}
    spine = [c for c in growth.spine if c in number]
    rows = [to_row(growth.spine_rows[growth.spine.index(c)]) for c in spine] if spine else []
    return Drafts.of_tree(
        tree,
        values=tuple(values),
        fed=tuple(growth.candidates[c].fed for c in kept),
        ranked=tuple(number[c] for c in ranked),
        spine=tuple(number[c] for c in spine),
        rows=mx.stack(rows) if rows else None,
        levels=levels,
    )


def _masks(growth: Growth, frontier: list[int], grammar, to_target) -> np.ndarray:
    """(len(frontier), drafter vocab) bool: what the grammar allows after each one's path."""
    masks = []
    for c in frontier:
        path = [] if c < 0 else [growth.candidates[n].token for n in growth.path(c)]
        mask = grammar.allowed_after(path)
        if mask is None:
            mask = np.zeros(grammar.width, dtype=bool)
        masks.append(mask if to_target is None else mask[to_target])
    return np.stack(masks)


def top_children(logits: mx.array, params: SamplingParams, count: int) -> tuple[mx.array, mx.array]:
    """The `count` most probable ids of each row of `logits` (rows, vocab), most probable
    first, and their log q (under the warp when sampling: what the target would draw from)."""
    count = min(count, logits.shape[-1])
    logits = logits.astype(mx.float32)
    logq = mx.log(warp(logits, params)) if not params.greedy else logits - mx.logsumexp(logits, -1, keepdims=True)
    # the top `count` by a partition, then those alone sorted: a whole row's sort costs ~4x
    # (a full vocabulary's, an MTP head's 150k+ ids, tens of milliseconds a level on a CPU)
    top = mx.argpartition(-logq, kth=count - 1, axis=-1)[..., :count]
    top_logq = mx.take_along_axis(logq, top, axis=-1)
    order = mx.argsort(-top_logq, axis=-1)
    return mx.take_along_axis(top, order, axis=-1), mx.take_along_axis(top_logq, order, axis=-1)
