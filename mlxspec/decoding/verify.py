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

Trees (tree.py). At a node, children are tried in turn, each one step of recursive
rejection sampling (Jeon et al., arXiv 2402.14160; SpecInfer's multi-step speculative
sampling, Miao et al., arXiv 2305.09781). Under sampling a node may have one child *drawn*
from the drafter's q (the tree's spine: drafters/tree_growth.py): it is tried first, with
the rule above, and on a rejection p becomes norm(max(0, p - q)). Its other children are
*point masses*, the drafter's most probable ids, chosen however it likes: with q_i one-hot,
a try accepts x_i with probability p_i(x_i) and otherwise removes x_i from p, so trying
them all in turn is the same as drawing y from what is left of p and following the child
that is y, or emitting y where none is. So the target reads every node of the tree in one
pass, and the walk (`walk_tree`) keeps the path of its decisions (`node_choice`: the drawn
child's coin and a draw from the rest, or its argmax): every id emitted has the
target's law given the ids before it, whatever the tree's shape, as long as a drawn child's
place in the tree did not depend on what was drawn. (EAGLE's tree verification treats its
candidates as point masses; a chain drawn from q is the tree whose every node is drawn, and
the walk is then the rule above.)
"""

from __future__ import annotations

import mlx.core as mx

from .sampling import SamplingParams, sample, warp
from .tree import TokenTree


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


def node_choice(
    logits: mx.array,  # (vocab,) the target's logits after one node of a tree
    params: SamplingParams,
    key: mx.array,
    *,
    drawn: tuple[int, mx.array] | None = None,  # the node's child drawn from q: (its id, q (vocab,))
) -> tuple[mx.array, mx.array]:
    """The target's decision at one node, lazy: (whether the drawn child is accepted, the
    target's id there). Greedy: its argmax. Sampling: a drawn child x is accepted with
    min(1, p(x) / q(x)) and the id is then drawn from norm(max(0, p - q)) (Leviathan et al.'s
    recovery); without a drawn child the id is drawn from p."""
    if params.greedy:
        return mx.array(False), mx.argmax(logits, axis=-1)
    target_probs = warp(logits, params)
    if drawn is None:
        return mx.array(False), sample(target_probs, key)
    token, draft_probs = drawn
    accept_key, draw_key = mx.random.split(key)
    accepted = mx.random.uniform(key=accept_key) < acceptance_probability(target_probs[token], draft_probs[token])
    return accepted, sample(residual(target_probs, draft_probs), draw_key)


def walk_tree(
    tree: TokenTree,
    logits: mx.array,  # (n + 1, vocab): the target after the root and after each node
    params: SamplingParams,
    key: mx.array,
    *,
    drawn: dict[int, tuple[int, mx.array]] | None = None,  # node -> (its drawn child, q it was drawn from)
) -> tuple[list[int], int]:
    """The rule over a tree: (the accepted nodes, the next id). Greedy: the argmax of every
    row at once, one wait. Sampling: node by node from the root, one wait each, warping and
    drawing only the rows the walk reaches (a row of a large vocabulary costs milliseconds
    on a CPU, and a round reaches about tau of them)."""
    if params.greedy:
        return tree.follow(mx.argmax(logits, axis=-1).tolist())
    drawn = drawn or {}
    path, node = [], 0
    for step_key in mx.random.split(key, tree.depth + 1):
        child, q = drawn.get(node, (None, None))
        accepted, choice = node_choice(
            logits[node], params, step_key, drawn=None if child is None else (tree.ids[child - 1], q)
        )
        accepted, choice = mx.stack([accepted.astype(mx.int32), choice.astype(mx.int32)]).tolist()
        following = tree.step(node, choice, drawn=child, accepted=bool(accepted))
        if following is None:
            return path, choice
        path.append(following)
        node = following
    raise AssertionError("a walk longer than its tree")
