"""The one warp function that turns logits into the distribution a token is drawn from
(settings: options.SamplingParams).

Draft, target and plain decoding all go through `warp`, so the probabilities the acceptance
rule compares are exactly the ones the tokens were sampled from. The filters follow
mlx-lm's `make_sampler`: top-p, min-p and top-k act on the untempered distribution, then
the temperature is applied to what survives. Probabilities stay float32 whatever the
weights' precision.
"""

from __future__ import annotations

import math

import mlx.core as mx

from ..options import SamplingParams

__all__ = ["SamplingParams", "constrain", "sample", "warp"]


def warp(logits: mx.array, params: SamplingParams) -> mx.array:
    """logits (..., vocab) -> probabilities (..., vocab), float32, rows summing to 1.

    Filtered-out ids get probability exactly 0. Not for greedy decoding (argmax needs no
    distribution).
    """
    logprobs = logits.astype(mx.float32)
    keep = None
    if params.top_p < 1:  # the one filter that reads probabilities, not their order or ratios
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        keep = _top_p_mask(logprobs, params.top_p)
    if params.min_p > 0:
        floor = logprobs.max(axis=-1, keepdims=True) + math.log(params.min_p)
        keep = _both(keep, logprobs >= floor)
    if 0 < params.top_k < logprobs.shape[-1]:
        # ids tied with the k-th largest are all kept: ties are measure-zero for real models
        # and keeping them makes the filter a pure function of the values.
        kth = mx.topk(logprobs, params.top_k, axis=-1).min(axis=-1, keepdims=True)
        keep = _both(keep, logprobs >= kth)
    if keep is not None:
        logprobs = mx.where(keep, logprobs, -mx.inf)
    # the top id at exactly 0 before dividing: a tiny temperature then sends the others to
    # -inf, never every id (a NaN row, which samples nothing the target would)
    logprobs = logprobs - logprobs.max(axis=-1, keepdims=True)
    return mx.softmax(logprobs / params.temp, axis=-1)


def constrain(logits: mx.array, allowed) -> mx.array:
    """Ids a grammar forbids get logit -inf, before warping or argmax, identically for the
    target, the draft and standard decoding (grammar.py says why that keeps the rule exact).
    `allowed` (..., vocab) bool, numpy or MLX; None: no grammar."""
    if allowed is None:
        return logits
    return mx.where(mx.array(allowed), logits, -mx.inf)


def _top_p_mask(logprobs: mx.array, top_p: float) -> mx.array:
    """Keep the most likely ids until their mass reaches top_p (the one crossing it included)."""
    ordered = mx.sort(logprobs, axis=-1)[..., ::-1]
    mass_before = mx.cumsum(mx.exp(ordered), axis=-1) - mx.exp(ordered)
    kept = mass_before < top_p
    threshold = mx.min(mx.where(kept, ordered, mx.inf), axis=-1, keepdims=True)
    # the top id always: a top_p that is 0 in float32 (1e-300) keeps it alone, as a tiny one does
    threshold = mx.minimum(threshold, ordered[..., :1])
    return logprobs >= threshold


def _both(a, b):
    return b if a is None else mx.logical_and(a, b)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """Draw one id per row of `probs` (..., vocab) with an explicit random key."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)
