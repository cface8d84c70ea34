"""One draft step's choice, shared by every drafter: the id, and q as the rule needs it."""

from __future__ import annotations

import mlx.core as mx

from ..decoding.sampling import SamplingParams, sample, warp


def pick(logits: mx.array, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array | None]:
    """One id from the last row of logits, and the distribution it was drawn from."""
    if params.greedy:
        return mx.argmax(logits, axis=-1), None
    probs = warp(logits, params)
    return sample(probs, key), probs


def confidence_of(logits: mx.array, probs: mx.array | None) -> mx.array:
    """The drafter's top probability (the early stop reads it)."""
    return (probs if probs is not None else mx.softmax(logits.astype(mx.float32))).max()
