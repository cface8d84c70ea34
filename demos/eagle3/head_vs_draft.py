"""The SmolLM2 EAGLE-3 head beside the two-block distilled draft, on one target in one run.

    python demos/eagle3/head_vs_draft.py [--head DIR] [--gamma 3|auto] [--temp 0,0.7] [--max-tokens 64] [--quick]

Loads the `smollm2-draft` preset's target once, with its two-block draft, and the head (the
shipped one unless --head) fitted to the same target, then, for every bench prompt and
temperature, runs each method in turn on the same prompt and seed: standard decoding, the
draft, the head, and each of the two beside prompt lookup. Taking the methods in turn per
prompt shares a slow spell of the machine out among them (`mlxspec bench` does the same for
its settings). Prints, per temperature and method, the decode speed (total tokens over
total decode time), the speedup over standard decoding in the same run, α overall and per
draft position, τ, and the draft's cost c: seconds per proposal over a standard step's.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlxspec  # noqa: E402
from mlxspec.generation import generate  # noqa: E402
from mlxspec.measure.prompts import suite  # noqa: E402
from mlxspec.models.heads import load_eagle3  # noqa: E402
from mlxspec.stats import Stats  # noqa: E402

SHIPPED_HEAD = Path(mlxspec.__file__).parent / "assets" / "smollm2-eagle3"


def draft_length(value: str) -> int | str:
    return value if value == "auto" else int(value)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    parser.add_argument("--gamma", type=draft_length, default=3, help="a draft length or auto")
    parser.add_argument("--temp", default="0,0.7")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="one prompt per category")
    args = parser.parse_args()
    temps = [float(t) for t in args.temp.split(",")]

    two_block = mlxspec.load_pair(pair="smollm2-draft")  # the preset that keeps the separate draft
    head = load_eagle3(str(args.head), args.head, two_block.target)
    with_head = replace(two_block, draft=head)
    methods = {
        "standard": (two_block, 0, False),
        "two-block draft": (two_block, args.gamma, False),
        "EAGLE-3 head": (with_head, args.gamma, False),
        "two-block + lookup": (two_block, args.gamma, True),
        "head + lookup": (with_head, args.gamma, True),
    }
    prompts = suite(quick=args.quick)
    print(
        f"{two_block.target.label}; head {args.head}; γ {args.gamma}; {len(prompts)} prompts; {args.max_tokens} tokens"
    )

    # a warm-up of each method, not counted
    for pair, gamma, ngram in methods.values():
        generate(pair, prompts[0].prompt, max_tokens=8, gamma=gamma, ngram=ngram, seed=0)

    for temp in temps:
        totals = {name: Stats() for name in methods}
        for number, prompt in enumerate(prompts):
            for name, (pair, gamma, ngram) in methods.items():
                result = generate(
                    pair, prompt.prompt, max_tokens=args.max_tokens, temp=temp, gamma=gamma, ngram=ngram, seed=number
                )
                totals[name] = totals[name].merge(result.stats)
            print(f"  T {temp}: {number + 1}/{len(prompts)} prompts", file=sys.stderr, flush=True)
        base = totals["standard"].tokens_per_second
        print(f"\nT {temp}")
        print(f"  {'method':<20} {'tok/s':>6} {'speedup':>8} {'α':>5}   {'α per position':<20} {'τ':>5} {'c':>6}")
        for name, stats in totals.items():
            speed = stats.tokens_per_second
            shown = 4 if args.gamma == "auto" else args.gamma
            per_position = " ".join(fmt(a) for a in stats.per_position_acceptance[:shown])
            c = stats.draft_step * base if stats.draft_step and base else None  # over a standard step
            print(
                f"  {name:<20} {fmt(speed, '.1f'):>6} {fmt(speed / base if speed and base else None):>7}x"
                f" {fmt(stats.acceptance_rate):>5}   {per_position:<20}"
                f" {fmt(stats.tokens_per_round):>5} {fmt(c, '.3f'):>6}"
            )


if __name__ == "__main__":
    main()
