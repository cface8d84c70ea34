"""How an id is drawn: the settings (`SamplingParams`), the one warp function that turns
logits into the distribution a token is drawn from, and one draft step's choice (`pick`).

Draft, target and plain decoding all go through `warp`, so the probabilities the acceptance
rule compares are exactly the ones the tokens were sampled from. The filters follow
mlx-lm's `make_sampler`: top-p, min-p and top-k act on the untempered distribution, then
the temperature is applied to what survives. Probabilities stay float32 whatever the
weights' precision.

MLX is imported inside the functions: options.py builds `SamplingParams` and must stay
MLX-free (`--help` is fast, views never load MLX).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidOption

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = ["SamplingParams", "confidence_of", "constrain", "pick", "sample", "warp"]

# Below float32's smallest normal number a temperature is subnormal: GPUs flush it to zero and
# 1/temp overflows float32 (whose largest is just under 2^128), so logits/temp is inf or NaN.
# Sampling at a temperature that small is greedy decoding in the limit, and is decoded so.
GREEDY_BELOW = 2.0**-126  # about 1.18e-38


@dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from a distribution (sampling.warp applies it); temp 0 is greedy,
    and so is a temperature below GREEDY_BELOW (stored as 0)."""

    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self):
        for name in ("temp", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidOption(f"{name.replace('_', '-')} must be a number, got {value!r}")
        if not math.isfinite(self.temp) or self.temp < 0:
            raise InvalidOption(f"temperature must be >= 0, got {self.temp}")
        if self.temp < GREEDY_BELOW:
            object.__setattr__(self, "temp", 0.0)  # frozen: set once, here
        if not (0 < self.top_p <= 1):
            raise InvalidOption(f"top-p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidOption(f"top-k must be a whole number >= 0, got {self.top_k}")
        if not (0 <= self.min_p < 1):
            raise InvalidOption(f"min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temp == 0


def warp(logits: mx.array, params: SamplingParams) -> mx.array:
    """logits (..., vocab) -> probabilities (..., vocab), float32, rows summing to 1.

    Filtered-out ids get probability exactly 0. Not for greedy decoding (argmax needs no
    distribution).
    """
    import mlx.core as mx  # in each function, not at the top: options.py imports this module

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
    import mlx.core as mx

    if allowed is None:
        return logits
    return mx.where(mx.array(allowed), logits, -mx.inf)


def _top_p_mask(logprobs: mx.array, top_p: float) -> mx.array:
    """Keep the most likely ids until their mass reaches top_p (the one crossing it included)."""
    import mlx.core as mx

    ordered = mx.sort(logprobs, axis=-1)[..., ::-1]
    mass_before = mx.cumsum(mx.exp(ordered), axis=-1) - mx.exp(ordered)
    kept = mass_before < top_p
    threshold = mx.min(mx.where(kept, ordered, mx.inf), axis=-1, keepdims=True)
    # the top id always: a top_p that is 0 in float32 (1e-300) keeps it alone, as a tiny one does
    threshold = mx.minimum(threshold, ordered[..., :1])
    return logprobs >= threshold


def _both(a, b):
    import mlx.core as mx

    return b if a is None else mx.logical_and(a, b)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """Draw one id per row of `probs` (..., vocab) with an explicit random key."""
    import mlx.core as mx

    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


def pick(logits: mx.array, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array | None]:
    """One id from the last row of logits, and the distribution it was drawn from (None when
    greedy): one draft step's choice, shared by every drafter."""
    import mlx.core as mx

    if params.greedy:
        return mx.argmax(logits, axis=-1), None
    probs = warp(logits, params)
    return sample(probs, key), probs


def confidence_of(logits: mx.array, probs: mx.array | None) -> mx.array:
    """The drafter's top probability (the early stop reads it)."""
    import mlx.core as mx

    return (probs if probs is not None else mx.softmax(logits.astype(mx.float32))).max()
