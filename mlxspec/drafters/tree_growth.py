"""Growing a draft tree from a drafter's distributions, EAGLE-2's way (Li et al., arXiv
2406.16858): expand, a few at a time, the frontier nodes the drafter is most sure of (the
product of its probabilities along the path), then keep the best nodes of everything
grown, up to a budget.

Under sampling a node's children are drawn *without replacement* from the drafter's q at
that node (Gumbel-top-k: the order of the perturbed keys is the order of the draws), and
each child's row is q with its earlier siblings removed: what the rule (verify.py) needs to
keep the target's distribution exactly (recursive rejection sampling, Jeon et al., arXiv
2402.14160). At temperature 0 the children are the drafter's top ids. Either way a node's
kept children must be the first ones drawn, and a node kept needs its parent: a node's
rank score is therefore capped by its parent's and its earlier siblings', so that keeping
the best scores keeps such a set.

Host bookkeeping on plain values; the drafter's forward and the draws stay with the caller
(one host wait per depth, for the ids chosen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx

from ..sampling import SamplingParams, warp
from ..tree import TokenTree
from .base import TreeDrafts


@dataclass
class Candidate:
    parent: int  # index of the parent candidate, -1: the root
    token: int  # target id
    choice: int  # the drafter's own id (its vocabulary may be a subset of the target's)
    depth: int
    score: float  # log of the drafter's probability of the path, capped (see module)
    rank: int  # among its siblings, in drawing order
    dist: int  # the row of `Growth.dists` it was drawn from: its parent's distribution
    fed: int = -1  # its row in the drafter's tree block, once the drafter has read it


@dataclass
class Growth:
    """Every candidate grown this round, and the distributions they were drawn from."""

    candidates: list[Candidate] = field(default_factory=list)
    dists: list[mx.array | None] = field(default_factory=list)  # (vocab,) the drafter's q (None when greedy)
    fed_order: list[int] = field(default_factory=list)  # candidates in the order the drafter read them

    def add_children(
        self, parent: int, dist: mx.array | None, choices: list[int], logps: list[float], to_target
    ) -> None:
        """Children of `parent` drawn from `dist`, in drawing order, with log q of each."""
        index = len(self.dists)
        self.dists.append(dist)
        cap = 0.0 if parent < 0 else self.candidates[parent].score
        depth = 1 if parent < 0 else self.candidates[parent].depth + 1
        for rank, (choice, logp) in enumerate(zip(choices, logps)):
            if not math.isfinite(logp):
                break  # nothing left to draw (a warped row narrower than the width asked)
            base = 0.0 if parent < 0 else self.candidates[parent].score
            score = min(base + logp, cap)
            cap = score
            token = choice if to_target is None else int(to_target[choice])
            self.candidates.append(Candidate(parent, token, choice, depth, score, rank, index))

    def at_depth(self, depth: int) -> list[int]:
        return [i for i, c in enumerate(self.candidates) if c.depth == depth]

    def frontier(self, depth: int, count: int) -> list[int]:
        """The `count` candidates at `depth` the drafter is surest of, to expand next."""
        best = sorted(self.at_depth(depth), key=lambda i: (-self.candidates[i].score, i))
        return sorted(best[:count])

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

    def best(self, budget: int) -> list[int]:
        """The `budget` best candidates (a set closed under parents and earlier siblings)."""
        order = sorted(range(len(self.candidates)), key=lambda i: (-self.candidates[i].score, i))
        return sorted(order[:budget])

    def tree(self, kept: list[int]) -> tuple[TokenTree, list[float]]:
        """The tree of the kept candidates (numbered as kept: parents first) and each node's
        value, the drafter's probability of its path."""
        number = {-1: 0} | {c: k for k, c in enumerate(kept, start=1)}
        parents = tuple(number[self.candidates[c].parent] for c in kept)
        ids = tuple(self.candidates[c].token for c in kept)
        return TokenTree(parents, ids), [math.exp(self.candidates[c].score) for c in kept]

    def rows(self, kept: list[int], *, to_row) -> mx.array:
        """(n, width) q of each kept node given its earlier siblings: its parent's row with
        the siblings drawn before it removed, renormalised; `to_row` places a drafter row
        on the target's ids."""
        out = []
        for c in kept:
            candidate = self.candidates[c]
            row = self.dists[candidate.dist]
            earlier = [
                s.choice
                for s in self.candidates
                if s.dist == candidate.dist and s.rank < candidate.rank and s.parent == candidate.parent
            ]
            if earlier:
                row = row.at[mx.array(earlier)].multiply(0.0)
                row = row / row.sum()
            out.append(to_row(row))
        return mx.stack(out)


def grow_tree(
    first: mx.array,
    expand,
    *,
    depth: int,
    width: int,
    budget: int,
    params: SamplingParams,
    key: mx.array,
    to_target=None,
    to_row=None,
) -> TreeDrafts | None:
    """Grow a tree from `first` (vocab,), the drafter's logits after the root; `expand(growth,
    frontier)` reads the frontier candidates (marked fed, in order) and returns their logits
    (len(frontier), vocab). `to_target`: the target id of each drafter id (host), None when
    they are the same; `to_row` places a q row on the target's ids."""
    keys = mx.random.split(key, depth)
    growth, frontier, rows = Growth(), [-1], first[None]
    for level in range(depth):
        probs, choices, logps = draw_children(rows, params, keys[level], width)
        mx.eval(choices, logps)
        for i, parent in enumerate(frontier):
            dist = None if probs is None else probs[i]
            growth.add_children(parent, dist, choices[i].tolist(), logps[i].tolist(), to_target)
        if level + 1 == depth:
            break
        frontier = growth.frontier(level + 1, width)
        if not frontier:
            break
        growth.feed(frontier)
        rows = expand(growth, frontier)
    kept = growth.best(budget)
    if not kept:
        return None
    tree, values = growth.tree(kept)
    rows = None if params.greedy else growth.rows(kept, to_row=to_row or (lambda row: row))
    fed = tuple(growth.candidates[c].fed for c in kept)
    return TreeDrafts(tree=tree, rows=rows, values=tuple(values), fed=fed)


def draw_children(
    logits: mx.array, params: SamplingParams, key: mx.array, count: int
) -> tuple[mx.array | None, mx.array, mx.array]:
    """Children for each row of `logits` (rows, vocab): (q (rows, vocab) or None when greedy,
    ids (rows, count) in drawing order, log q of each (rows, count)). Greedy: the top ids.
    Sampling: Gumbel-top-k over log q, a draw without replacement."""
    count = min(count, logits.shape[-1])
    if params.greedy:
        logq = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
        keys, probs = logq, None
    else:
        probs = warp(logits, params)
        logq = mx.log(probs)
        keys = logq - mx.log(-mx.log(mx.random.uniform(shape=logq.shape, key=key)))
    ids = mx.argsort(-keys, axis=-1)[..., :count]
    return probs, ids, mx.take_along_axis(logq, ids, axis=-1)
