"""mlx-lm's own generation, run on the same pair, prompt and sampling settings, for
like-for-like comparisons (bench and demos).

mlx-lm's speculative decoding samples the draft's token and, independently, the target's,
and keeps drafts while the two are equal. That is exact, but accepts a draft with
probability sum(p * q) rather than sum(min(p, q)), so it accepts less at temperature > 0.
It reports only a per-token `from_draft` flag; rounds are recovered from the flags (each
round ends with one token the target produced).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from ..models.pairs import Pair
from ..stats import Stats


class PeerUnavailable(RuntimeError):
    """mlx-lm cannot run this pair (its speculative decoding refuses caches it cannot trim)."""


@dataclass
class PeerRun:
    tokens: list[int]  # the ids mlx-lm generated, end-of-sequence excluded
    stats: Stats  # decode seconds (the prompt already in the caches), rounds, acceptance


def mlx_lm_generate(
    pair: Pair,
    prompt: list[int],
    *,
    max_tokens: int,
    gamma: int,
    temp: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int = 0,
) -> PeerRun:
    """mlx_lm.stream_generate with `draft_model` and `num_draft_tokens` (gamma > 0) or the
    target alone (gamma = 0). The caches are filled with the prompt beforehand, so `seconds`
    is decoding alone, as mlxspec's decode time is. mlx-lm reads the global random state:
    seeded here."""
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(temp=temp, top_p=top_p if top_p < 1 else 0.0, min_p=min_p, top_k=top_k)
    options = dict(max_tokens=max_tokens, sampler=sampler)
    models = [pair.target.model] + ([pair.draft.model] if gamma > 0 else [])
    caches = []
    for model in models:
        cache = make_prompt_cache(model)
        if len(prompt) > 1:
            model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        caches += cache
    options["prompt_cache"] = caches
    if gamma > 0:
        options.update(draft_model=pair.draft.model, num_draft_tokens=gamma)
    mx.random.seed(seed)
    tokens, flags = [], []
    start = time.perf_counter()
    try:
        for response in stream_generate(pair.target.model, pair.tokenizer, mx.array(prompt[-1:]), **options):
            if response.finish_reason == "stop" and response.token in pair.eos_ids:
                break
            tokens.append(response.token)
            flags.append(response.from_draft)
    except ValueError as e:  # e.g. "Speculative decoding requires a trimmable prompt cache"
        raise PeerUnavailable(str(e).splitlines()[0]) from None
    seconds = time.perf_counter() - start
    stats = Stats(
        prompt_tokens=len(prompt),
        tokens=len(tokens),
        emitted=len(tokens),
        decode_seconds=seconds,
        gamma=gamma,
        seed=seed,
    )
    run = 0
    for from_draft in flags:
        if from_draft:
            run += 1
            continue
        stats.rounds += 1
        stats.accepted += run
        if gamma:
            stats.tested += min(run + 1, gamma)
        run = 0
    return PeerRun(tokens, stats)
