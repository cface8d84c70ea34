"""Measure the cost model of a pair on this machine: the draft's step time relative to the
target's (c), and the target's verify-cost curve v(k) = time of a k-token forward pass over
time of a 1-token pass. On a memory-bound device v stays near 1 for small k, which is what
makes speculation pay; a quantized matmul that grows with rows (MLX's CPU backend, some
Metal kernels) shows up here first.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import mlx.core as mx

from ..decoding.caches import make_cache
from ..decoding.sampling import SamplingParams, warp
from ..drafters import DFLASH
from ..models.pairs import Pair


@dataclass(frozen=True)
class Costs:
    target_step: float  # seconds for one target token (forward + sampling)
    draft_step: float  # seconds for one draft token (forward + sampling)
    verify_curve: tuple[float, ...]  # v(k) for k = 1..len, v(1) = 1

    @property
    def c(self) -> float:
        return self.draft_step / self.target_step

    def verify_cost(self, tokens: int) -> float:
        """v(tokens); beyond the measured range, the last slope continues. Never below 1: a
        k-token pass does the 1-token pass's work and more, so a v(k) timed under 1 is the
        timing's noise (the curve keeps what was timed; the bench marks it)."""
        curve = self.verify_curve
        if tokens <= len(curve):
            return max(curve[tokens - 1], 1.0)
        slope = curve[-1] - curve[-2] if len(curve) > 1 else 0.0
        return max(curve[-1] + slope * (tokens - len(curve)), 1.0)

    @property
    def noisy_verify(self) -> list[int]:
        """The k whose v(k) was timed below 1 (see verify_cost)."""
        return [k for k, v in enumerate(self.verify_curve, start=1) if v < 1.0]

    def to_dict(self) -> dict:
        return {
            "target_step_ms": self.target_step * 1e3,
            "draft_step_ms": self.draft_step * 1e3,
            "c": self.c,
            "verify_curve": list(self.verify_curve),
        }


def _forward_time(model, cache, ids: list[int], params: SamplingParams, repeats: int) -> float:
    """Median seconds of one forward over `ids` appended to `cache`, plus warping the last
    row as decoding does; the cache is put back after each pass."""
    times = []
    tokens = mx.array(ids)[None]
    for _ in range(repeats + 1):  # the first pass warms up
        mark = cache.mark()
        start = time.perf_counter()
        logits = model(tokens, cache=cache.layers)[0]
        cache.length += len(ids)
        out = mx.argmax(logits, axis=-1) if params.greedy else warp(logits, params)
        mx.eval(out)
        times.append(time.perf_counter() - start)
        cache.restore(mark)
    return statistics.median(times[1:])


def measure(
    pair: Pair, prompt: list[int], *, max_tokens: int = 9, repeats: int = 7, params: SamplingParams | None = None
) -> Costs:
    """Time the target over 1..max_tokens tokens and the draft over one, both after reading
    `prompt` (a realistic cache length)."""
    params = params or SamplingParams()
    filler = [prompt[-1]] * max_tokens

    target_cache = make_cache(pair.target.model, "target")
    pair.target.model(mx.array(prompt)[None], cache=target_cache.layers)
    target_cache.length = len(prompt)
    mx.eval(target_cache.state)
    times = [
        _forward_time(pair.target.model, target_cache, filler[:k], params, repeats) for k in range(1, max_tokens + 1)
    ]

    draft_step = 0.0
    if pair.kind is not None and pair.kind.name == DFLASH:
        draft_step = _block_time(pair, prompt, params, repeats)
    elif pair.kind is not None and pair.kind.reads_features:
        draft_step = _head_step_time(pair, prompt, params, repeats)
    elif pair.draft is not None:
        draft_cache = make_cache(pair.draft.model, "draft")
        readable = [t if t < pair.draft.width else 0 for t in prompt]  # as the engine feeds it
        pair.draft.model(mx.array(readable)[None], cache=draft_cache.layers)
        draft_cache.length = len(prompt)
        mx.eval(draft_cache.state)
        draft_step = _forward_time(pair.draft.model, draft_cache, filler[:1], params, repeats)
    return Costs(times[0], draft_step, tuple(t / times[0] for t in times))


def _block_time(pair: Pair, prompt: list[int], params: SamplingParams, repeats: int) -> float:
    """Median seconds of a DFlash drafter's block forward (its whole chain: one forward
    whatever γ) after reading the prompt's rows, with its rows warped when sampling."""
    from ..decoding import capture

    draft = pair.draft.model
    pair.target.model(mx.array(prompt[:-1])[None])
    cache = draft.make_cache()
    draft.read_context(capture.taps_of(pair.target.model).take(), cache)
    config = draft.config
    block = mx.array([[prompt[-1]] + [config.mask_token_id] * (config.block_size - 1)])
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        logits = draft(block, cache)[0, 1:]
        mx.eval(mx.argmax(logits, axis=-1) if params.greedy else warp(logits, params))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _head_step_time(pair: Pair, prompt: list[int], params: SamplingParams, repeats: int) -> float:
    """Median seconds of one chained step of a head (EAGLE-3, MTP) after reading the prompt's rows
    (its features taken from one target pass), with its q placed at target width as the
    engine does when sampling."""
    from mlx_lm.models.cache import KVCache

    from ..decoding import capture

    head = pair.draft.model
    pair.target.model(mx.array(prompt[:-1])[None])
    features = capture.taps_of(pair.target.model).take()
    cache = KVCache()
    _, out = head(mx.array(prompt[1:])[None], features, cache)
    mx.eval(out, cache.state)
    token, hidden = mx.array([[prompt[-1]]]), out[:, -1:]
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        logits, _ = head(token, hidden, cache, chained=True)
        if head.draft_to_target is None:  # an MTP head: the target's whole vocabulary
            result = mx.argmax(logits[0, -1]) if params.greedy else warp(logits[0, -1], params)
        elif params.greedy:
            result = head.draft_to_target[mx.argmax(logits[0, -1])]
        else:
            result = mx.zeros((pair.target.width,)).at[head.draft_to_target].add(warp(logits[0, -1], params))
        mx.eval(result)
        times.append(time.perf_counter() - start)
        cache.trim(1)
    return statistics.median(times[1:])
