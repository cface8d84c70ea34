"""DDTree (arXiv 2604.12989): a draft tree from ONE block forward's per-position distributions.

A block drafter (DFlash) gives, in one forward, a distribution q_d for every depth d of the
block, each independent of the ids before it. DDTree takes the paths the drafter finds most
probable, best first: a path's value is the product of q_d(t_d) along it, and a heap over
(parent, depth, rank) pops the next most probable path, whose one new node is its last id;
popping a node pushes its next sibling (the next most probable id at its depth) and its first
child (the most probable id one depth further). Every node's parent is popped before it (a
child is never more probable than its parent) and siblings come most probable first, so the
nodes in the order popped are a tree at any prefix, until the budget. mlx-vlm's
`speculative/ddtree.py` builds the same heap; the tree is verified by mlxspec's own tree path
(an ancestor-only mask, decoding/tree_attention.py) and walked by its tree rule (verify.py).

Exact at every temperature. At temperature 0 the walk follows the target's argmax, whatever
the tree. Under sampling the tree has a spine, as tree_growth.py's trees do: from the root,
one child per depth drawn from that depth's warped q_d, added first and kept whole (its
place never depends on what was drawn), and tried first with min(1, p/q_d); since the block's
rows do not depend on the ids before them, q_d is exactly the distribution the drawn child
was drawn from given its ancestors. Every other node is a point mass the heap chose. A heap
node with the same parent and id as a spine node is that node.
"""

from __future__ import annotations

import heapq
import math

import mlx.core as mx

from ..decoding.carry import Carry
from ..decoding.drafter import Drafts
from ..decoding.sampling import sample, warp
from .tree_growth import Candidate, Growth, top_children


def block_tree(logits: mx.array, *, budget: int, carry: Carry, to_target=None, to_row=lambda row: row) -> Drafts | None:
    """The tree of at most `budget` nodes from `logits` (depth, its vocab): row d - 1 the
    drafter's logits for the id at depth d. A drafter over part of the target's ids maps
    them (`to_target`, on the host) and its rows (`to_row`) to the target's, as
    tree_growth.grow_tree does. None: nothing to propose."""
    params = carry.params
    depth = logits.shape[0]
    choices, logps = top_children(logits, params, budget)
    growth = Growth()
    if not params.greedy:
        rows = warp(logits.astype(mx.float32), params)
        drawn = sample(rows, carry.key)
        mx.eval(choices, logps, rows, drawn)
        _add_spine(growth, rows, drawn.tolist()[:budget], to_target)
    else:
        mx.eval(choices, logps)
    choices, logps = choices.tolist(), logps.tolist()
    node_of = {(c.parent, c.token): i for i, c in enumerate(growth.candidates)}
    added = len(growth.candidates)
    heap = [(-logps[0][0], 0, -1, 1, 0)]  # (-value, order, parent, depth, rank)
    order = 1
    while heap and added < budget:
        _, _, parent, d, rank = heapq.heappop(heap)
        logp = logps[d - 1][rank]
        if not math.isfinite(logp):
            continue  # past what the warped row allows: no id, no sibling after it
        choice = choices[d - 1][rank]
        token = choice if to_target is None else int(to_target[choice])
        node = node_of.get((parent, token))
        if node is None:  # a new node (else the spine's, already there)
            base = 0.0 if parent < 0 else growth.candidates[parent].score
            node = len(growth.candidates)
            growth.candidates.append(Candidate(parent, token, choice, d, base + logp, rank))
            node_of[parent, token] = node
            added += 1
        score = growth.candidates[node].score
        if rank + 1 < len(logps[d - 1]):
            base = 0.0 if parent < 0 else growth.candidates[parent].score
            heapq.heappush(heap, (-(base + logps[d - 1][rank + 1]), order, parent, d, rank + 1))
            order += 1
        if d < depth:
            heapq.heappush(heap, (-(score + logps[d][0]), order, node, d + 1, 0))
            order += 1
    if not growth.candidates:
        return None
    kept = list(range(len(growth.candidates)))  # in the order added: parents first, the spine first
    tree, values = growth.tree(kept)
    ranked = growth.ranked()
    return Drafts.of_tree(
        tree,
        values=tuple(values),
        fed=(-1,) * len(kept),  # the drafter reads no node: the block was its only forward
        ranked=tuple(n + 1 for n in ranked),
        spine=tuple(n + 1 for n in growth.spine),
        rows=mx.stack([to_row(row) for row in growth.spine_rows]) if growth.spine else None,
        levels=1,
    )


def _add_spine(growth: Growth, rows: mx.array, drawn: list[int], to_target) -> None:
    """The chain drawn from each depth's row, one node a depth, each the child of the last."""
    parent, score = -1, 0.0
    for d, choice in enumerate(drawn, start=1):
        q = rows[d - 1]
        p = q[choice].item()
        token = choice if to_target is None else int(to_target[choice])
        if not p > 0:
            break  # a row that allows nothing here: the spine ends
        score += math.log(p)
        growth.spine.append(len(growth.candidates))
        growth.spine_rows.append(q)
        growth.candidates.append(Candidate(parent, token, choice, d, score, 0, drawn=True, first=True))
        parent = len(growth.candidates) - 1
