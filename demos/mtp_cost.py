"""What an MTP head costs beside its target, on the tests' tiny models (tests/support/mtp_models.py):
a Qwen3.5, a Qwen3.5-MoE, a Qwen3-Next and a GLM-4.7-Flash-style (glm4_moe_lite) model of a
few hundred thousand parameters, saved in the hub's layout with heads fitted for a few
seconds to their own continuations.

Per family: one target step and one chained head step after a 200-token prompt (median of
60, argmax included, float32, OpenBLAS preloaded), their ratio c, and greedy acceptance by
draft position at γ 4 over 64 tokens from the prompt the head was fitted on (a toy's figure:
it says the wiring works, not what a real head accepts).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m demos.mtp_cost
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

import mlxspec
from mlxspec.decoding import capture
from mlxspec.models import synthetic
from tests.conftest import stdlib_texts
from tests.support.mtp_models import write_hub_model

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "glm4_moe_lite")
PROMPT = list(range(10, 22))
CONTEXT = 200
REPEATS = 60


def median_seconds(step) -> float:
    times = []
    for _ in range(REPEATS + 5):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:])


def costs(pair) -> tuple[float, float]:
    """(target step, head step) in seconds, each after a CONTEXT-token prompt."""
    model, head = pair.target.model, pair.draft.model
    ids = [int(i) for i in mx.random.randint(3, 500, (CONTEXT,), key=mx.random.key(0)).tolist()]
    cache = make_prompt_cache(model)
    model(mx.array([ids]), cache=cache)
    hidden = capture.taps_of(model).take()
    head_cache = KVCache()
    _, out = head(mx.array([ids[1:]]), hidden[:, :-1], head_cache)
    mx.eval([c.state for c in cache], out, head_cache.state)
    last = mx.array([[ids[-1]]])

    def target_step():
        mx.eval(mx.argmax(model(last, cache=cache)[0, -1]))
        capture.taps_of(model).seen.clear()
        for c in cache:  # attention back to CONTEXT; the recurrent state just runs on (cost only)
            if c.is_trimmable():
                c.trim(1)

    def head_step():
        logits, _ = head(last, out[:, -1:], head_cache, chained=True)
        mx.eval(mx.argmax(logits[0, -1]))
        head_cache.trim(1)

    return median_seconds(target_step), median_seconds(head_step)


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        tokenizer = Path(root) / "tokenizer"
        synthetic.train_tokenizer(stdlib_texts(), 512, tokenizer)
        eos = [0, 2]
        print(f"{'family':<15} {'target ms':>9} {'head ms':>8} {'c':>6}   α by position (γ 4, greedy)   τ")
        for family in FAMILIES:
            folder = write_hub_model(
                family,
                Path(root) / family,
                tokenizer_dir=tokenizer,
                eos_token_ids=eos,
                fit_steps=100,
                fit_prompts=[PROMPT],
            )
            pair = mlxspec.load_pair(str(folder), "mtp")
            target, head = costs(pair)
            stats = mlxspec.generate(pair, PROMPT, max_tokens=64, gamma=4).stats
            rates = " ".join("–" if r is None else f"{r:.2f}" for r in stats.per_position_acceptance)
            print(
                f"{family:<15} {target * 1e3:>9.2f} {head * 1e3:>8.2f} {head / target:>6.3f}   {rates:<29} "
                f"{stats.tokens_per_round:.2f}"
            )


if __name__ == "__main__":
    main()
