"""The acceptance rule of speculative sampling, on arrays: no models, no caches.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding",
ICML 2023 (arXiv 2211.17192), Algorithm 1; Chen et al. 2023 (arXiv 2302.01318) state the
same rule. Drafted id x_i was sampled from the draft's distribution q_i. It is accepted
with probability min(1, p_i(x_i) / q_i(x_i)), where p_i is the target's distribution at
that position. At the first rejection the emitted id is *recovered* from
norm(max(0, p_i - q_i)) and the remaining drafts are discarded; if every draft is
accepted, a *bonus* id is drawn from the target's next distribution p_{gamma+1}. Each
emitted id then has exactly the target's distribution.

Both outcomes are one formula here: the draft rows are padded with a zero row, so the row
after the last accepted draft is max(0, p - q) at a rejection and p itself for the bonus.
"""

from __future__ import annotations

import mlx.core as mx

from .sampling import sample
from .tree import TokenTree, Tree


def acceptance_probability(target_prob: mx.array, draft_prob: mx.array) -> mx.array:
    """min(1, p(x) / q(x)) elementwise. Where q(x) is not positive (an id the draft could not
    have proposed, or a NaN row from a draft whose logits overflowed) the draft is rejected:
    the id is then drawn from the residual, which falls back to p for a NaN row, so the
    output stays the target's whatever the draft computed."""
    ratio = target_prob / mx.where(draft_prob > 0, draft_prob, 1)
    return mx.where(draft_prob > 0, mx.minimum(ratio, 1), 0)


def residual(target_probs: mx.array, draft_probs: mx.array) -> mx.array:
    """norm(max(0, p - q)) along the last axis. Where p <= q everywhere (only possible when
    p == q, so no rejection can happen there) or q holds NaN it falls back to p."""
    excess = mx.maximum(target_probs - draft_probs, 0)
    total = excess.sum(axis=-1, keepdims=True)
    return mx.where(total > 0, excess / mx.where(total > 0, total, 1), target_probs)


def speculative_sample(
    drafted: mx.array,  # (gamma,) int: ids proposed by the draft
    draft_probs: mx.array,  # (gamma, vocab) float32: q_i, the rows they were sampled from
    target_probs: mx.array,  # (gamma + 1, vocab) float32: p_i at each drafted position, plus one
    key: mx.array,
) -> tuple[mx.array, mx.array]:
    """Returns (number of accepted drafts, the recovered or bonus id), both lazy scalars."""
    gamma = drafted.shape[0]
    accept_key, next_key = mx.random.split(key)
    at = drafted[:, None]
    p_x = mx.take_along_axis(target_probs[:gamma], at, axis=-1)[:, 0]
    q_x = mx.take_along_axis(draft_probs, at, axis=-1)[:, 0]
    u = mx.random.uniform(shape=(gamma,), key=accept_key)
    accepted = u < acceptance_probability(p_x, q_x)
    num_accepted = mx.cumprod(accepted.astype(mx.int32)).sum()

    padded_draft = mx.concatenate([draft_probs, mx.zeros_like(target_probs[:1])])
    row = residual(target_probs[num_accepted], padded_draft[num_accepted])
    return num_accepted, sample(row, next_key)


def greedy_sample(
    drafted: mx.array,  # (gamma,) int: the draft's argmax ids
    target_ids: mx.array,  # (gamma + 1,) int: the target's argmax at each position, plus one
) -> tuple[mx.array, mx.array]:
    """Temperature 0: the rule with one-hot p and q is exact argmax matching."""
    gamma = drafted.shape[0]
    num_accepted = mx.cumprod((drafted == target_ids[:gamma]).astype(mx.int32)).sum()
    return num_accepted, target_ids[num_accepted]


def tree_greedy_sample(
    tree: TokenTree,
    target_ids: list[int],  # (n + 1,) the target's argmax after the root and after each node
) -> tuple[list[int], int]:
    """Temperature 0 over a tree: the longest path whose every id is the target's argmax
    given its ancestors, and the target's id after it. Host values: the walk is a few steps."""
    return tree.greedy_path(target_ids)


def tree_speculative_sample(
    tree: Tree,
    drafted: mx.array,  # (n,) int: node k's id at k - 1
    draft_probs: mx.array,  # (n, vocab) float32: row k - 1 is what node k was drawn from, given its earlier siblings
    target_probs: mx.array,  # (n + 1, vocab) float32: p after the root, then after each node
    key: mx.array,
) -> tuple[mx.array, mx.array]:
    """Multi-candidate speculative sampling down a tree; returns (the accepted node at each
    depth, 0 past the path; the recovered or bonus id), lazy.

    At a node, its children are tried in the order they were drawn: child i, drawn from
    q_i given the children before it, is accepted with probability min(1, p_i(x_i) / q_i(x_i));
    after a rejection p_{i+1} = norm(max(0, p_i - q_i)). The first child accepted becomes the
    node; when all are rejected the id is drawn from the last p_i (from p itself at a node
    without children: the bonus). Each try is one step of Leviathan et al.'s rule for p_i
    against a proposal drawn from q_i, so the id emitted at a node has exactly p's law given
    the path: SpecInfer's multi-step speculative sampling (Miao et al., arXiv 2305.09781,
    Theorem 4.2) for children drawn independently from one q, and recursive rejection
    sampling (Jeon et al., arXiv 2402.14160) for children drawn without replacement, whose
    q_i is q with the earlier children removed. A point mass (prompt lookup) is q_i = one-hot:
    it is accepted with probability p_i(x), and p_{i+1} is p_i without x.

    The walk is unrolled over the tree's depths with the current node an array, so the
    whole rule is one lazy graph and the host waits once."""
    width = target_probs.shape[-1]
    children, depth_of = tree.children, tree.depths
    slots_at = [0] * (tree.depth + 1)  # most children of any node at each depth
    for node, kids in enumerate(children):
        slots_at[depth_of[node]] = max(slots_at[depth_of[node]], len(kids))
    slots = max(slots_at)
    # (n + 1, slots) each node's children in drawing order; 0 (the root, nobody's child) pads
    table = mx.array([list(kids) + [0] * (slots - len(kids)) for kids in children], dtype=mx.int32)
    ids = mx.concatenate([mx.zeros((1,), dtype=mx.int32), drafted.astype(mx.int32)])
    rows = mx.concatenate([mx.zeros((1, width), dtype=draft_probs.dtype), draft_probs])
    accept_key, next_key = mx.random.split(key)
    coins = mx.random.uniform(shape=(len(slots_at), max(slots, 1)), key=accept_key)

    node = mx.array(0, dtype=mx.int32)
    walking = mx.array(True)
    final = target_probs[0]
    path = []
    for depth, count in enumerate(slots_at):
        p = mx.take(target_probs, node, axis=0)
        moved, chosen = mx.array(False), mx.array(0, dtype=mx.int32)
        for slot in range(count):
            child = mx.take(table[:, slot], node)
            tried = walking & (child > 0) & ~moved
            x = mx.take(ids, child)
            q = mx.take(rows, child, axis=0)
            accepted = tried & (coins[depth, slot] < acceptance_probability(p[x], q[x]))
            p = mx.where(tried & ~accepted, residual(p, q), p)
            chosen = mx.where(accepted, child, chosen)
            moved = moved | accepted
        final = mx.where(walking & ~moved, p, final)
        path.append(chosen)
        walking = walking & moved
        node = mx.where(moved, chosen, node)
    return mx.stack(path[:-1]) if len(path) > 1 else mx.zeros((0,), dtype=mx.int32), sample(final, next_key)
