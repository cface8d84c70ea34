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

Trees (tree.py). A tree's candidates are point masses, chosen by the drafter however it
likes (its most probable ids, a shape grown from its confidences). With q_i one-hot,
recursive rejection over a node's children (Jeon et al., arXiv 2402.14160; SpecInfer's
multi-step speculative sampling, Miao et al., arXiv 2305.09781: accept child x_i with
probability p_i(x_i), else remove x_i from p and renormalise, then try the next) emits x_i
with probability p(x_i) and any other id y with p(y): it is the same as drawing y from p
and following the child that is y, or emitting y where no child is. So the target chooses
once at every node of the tree (`target_choices`: its argmax, or a draw from its warped p),
all in one pass, and the walk (TokenTree.follow) keeps the path of its choices: every id
emitted is the target's own choice given the ids before it, whatever the tree, and no q is
needed. (EAGLE's tree verification under sampling treats its candidates so too.) A chain
keeps the rule above, which accepts x with min(1, p(x)/q(x)) >= p(x): better for one
candidate per position, drawn from q.
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


def target_choices(logits: mx.array, params: SamplingParams, key: mx.array) -> mx.array:
    """The target's id at every row of a tree's verify (rows, vocab) -> (rows,): its argmax,
    or an independent sample of its warped distribution at each row."""
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return sample(warp(logits, params), key)  # one key, independent draws per row
