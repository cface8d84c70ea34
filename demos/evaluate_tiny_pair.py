"""Acceptance, cost and speedup of the bundled tiny pair on held-out code, for its model card.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') \
        python demos/evaluate_tiny_pair.py [--prompts 20] [--max-tokens 64] [--gamma 4]

Prompts come from standard-library files the pair never trained on (demos/stdlib_corpus.py
holds the split): a file's text up to a function definition and its first body line. For
greedy decoding and temperature 0.8 (seeded), the engine's own statistics give the
acceptance rate α = accepted / tested pooled over all prompts; the cost ratio c and the
verify curve come from `mlxspec.measure.costs`, and the speedup from timing standard and
speculative decoding on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from demos.stdlib_corpus import continuation_prompts, split_files  # noqa: E402
from mlxspec.drafting.theory import expected_tokens_per_round  # noqa: E402
from mlxspec.measure import costs  # noqa: E402


def run(pair, prompts, *, gamma: int, temp: float, max_tokens: int) -> dict:
    accepted = tested = tokens = rounds = 0
    seconds = 0.0
    for i, prompt in enumerate(prompts):
        result = mlxspec.generate(pair, prompt, max_tokens=max_tokens, gamma=gamma, temp=temp, seed=i, raw=True)
        s = result.stats
        accepted, tested, tokens, rounds = (
            accepted + s.accepted,
            tested + s.tested,
            tokens + s.tokens,
            rounds + s.rounds,
        )
        seconds += s.decode_seconds
    return {
        "gamma": gamma,
        "temp": temp,
        "acceptance_rate": accepted / tested if tested else None,
        "tokens_per_round": tokens / rounds if rounds else None,
        "tokens_per_second": tokens / seconds if seconds else None,
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()

    pair = mlxspec.load_pair(args.target, args.draft)
    _, held_out = split_files()
    prompts = continuation_prompts(held_out, args.prompts)
    # warm-up, not counted
    mlxspec.generate(pair, prompts[0], max_tokens=8, gamma=args.gamma, raw=True)
    mlxspec.generate(pair, prompts[0], max_tokens=8, gamma=0, raw=True)

    ids = pair.tokenizer.encode(prompts[0])
    measured = costs.measure(pair, ids)
    report = {
        "pair": pair.description,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "costs": measured.to_dict(),
    }
    for temp in (0.0, 0.8):
        standard = run(pair, prompts, gamma=0, temp=temp, max_tokens=args.max_tokens)
        speculative = run(pair, prompts, gamma=args.gamma, temp=temp, max_tokens=args.max_tokens)
        alpha = speculative["acceptance_rate"]
        predicted = expected_tokens_per_round(alpha, args.gamma) / (
            args.gamma * measured.c + measured.verify_cost(args.gamma + 1)
        )
        report[f"temp {temp:g}"] = {
            "acceptance_rate": round(alpha, 3),
            "tokens_per_round": round(speculative["tokens_per_round"], 2),
            "standard_tokens_per_second": round(standard["tokens_per_second"], 1),
            "speculative_tokens_per_second": round(speculative["tokens_per_second"], 1),
            "speedup": round(speculative["tokens_per_second"] / standard["tokens_per_second"], 3),
            "predicted_speedup": round(predicted, 3),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
