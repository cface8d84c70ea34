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
that is y, or emitting y where none is. So the target decides every node of the tree in
one pass (`tree_choices`: the drawn child's coin and a draw from the rest, or its argmax),
and the walk (TokenTree.follow) keeps the path of its choices: every id emitted has the
target's law given the ids before it, whatever the tree's shape, as long as a drawn child's
place in the tree did not depend on what was drawn. (EAGLE's tree verification treats its
candidates as point masses; a chain drawn from q is the tree whose every node is drawn, and
the walk is then the rule above.)
"""

from __future__ import annotations

import mlx.core as mx

from .sampling import SamplingParams, sample, warp


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


def tree_choices(
    logits: mx.array,  # (n + 1, vocab): the target after the root and after each node
    params: SamplingParams,
    key: mx.array,
    *,
    spine_ids: mx.array | None = None,  # (m,) the drawn children, root side first
    spine_parents: list[int] = (),  # (m,) the row of each one's parent: 0, then the spine before it
    spine_rows: mx.array | None = None,  # (m, vocab) q each was drawn from
) -> tuple[mx.array, mx.array]:
    """What the walk (TokenTree.follow) needs from the target's rows, in one lazy graph:
    (whether each drawn child is accepted, (m,); the target's id at every row, (n + 1,)).

    Greedy: the argmax at every row, and no drawn children. Sampling: a drawn child x of a
    row is accepted with min(1, p(x)/q(x)), and that row's id is then drawn from
    norm(max(0, p - q)), Leviathan et al.'s recovery; every other row's id is drawn from p."""
    if params.greedy:
        return mx.zeros((0,), dtype=mx.bool_), mx.argmax(logits, axis=-1)
    accept_key, draw_key = mx.random.split(key)
    target_probs = warp(logits, params)
    accepted = mx.zeros((0,), dtype=mx.bool_)
    if spine_ids is not None and len(spine_parents):
        parents = mx.array(list(spine_parents))
        p, x = target_probs[parents], spine_ids[:, None]
        ratio = acceptance_probability(mx.take_along_axis(p, x, -1)[:, 0], mx.take_along_axis(spine_rows, x, -1)[:, 0])
        accepted = mx.random.uniform(shape=ratio.shape, key=accept_key) < ratio
        target_probs = target_probs.at[parents].add(residual(p, spine_rows) - p)
    return accepted, sample(target_probs, draw_key)  # one key, independent draws per row
